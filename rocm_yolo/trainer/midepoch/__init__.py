"""Mid-epoch checkpoints: a run continued at the next batch, as if it had never stopped.

The record is :class:`rocm_yolo.run.midepoch_state.MidEpochState`; here is what writes and reads it.

- :mod:`.capture`: the training state copied to host memory and back (tensors, RNG states);
- :mod:`.save`: writing them every ``--checkpoint-every``, off the training thread;
- :mod:`.restore`: whether one can continue here, and continuing from it;
- :mod:`.sample_order`: the training samples' order, recorded for every pass and replayed;
- :mod:`.relayout`: a run on another number of GPUs than its own, each step's images kept (the order laid over the
  run's ranks, micro-batches, the run's counters).
"""
