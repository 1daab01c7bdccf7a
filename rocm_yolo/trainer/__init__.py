"""The training child: the one process that imports torch and Ultralytics and trains.

Started fresh by the supervisor as ``python -m rocm_yolo.trainer SPEC.json`` (never forked
from a process that imported torch); on several GPUs, one per GPU by torch's agent, which the DDP
launcher starts (:mod:`rocm_yolo.ddp`).

- :mod:`.entry`: the process entry: it orders the steps that make DataLoader workers safe, and
  returns the exit code the supervisor acts on;
- :mod:`.setup`: the environment and presets, the fork server, checked imports, the patches;
- :mod:`.training`: ``YOLO(model).train(**args)`` with rocm-yolo's callbacks, and a failure during training as one
  line and an exit code (one before it: :mod:`rocm_yolo.setup_failure`, as the DDP launcher's);
- :mod:`.train_args`: what a run passes to ``model.train``, and on a resume what changed;
- :mod:`.rank`: what differs in a rank of a multi-GPU run (its heartbeat FIFO, the global world size, ...);
- :mod:`.callbacks`: the Ultralytics callbacks (the trainer's settings, the heartbeat) and their registry;
- :mod:`.midepoch`: mid-epoch checkpoints: the state captured, saved, restored, the sample order;
- :mod:`.forkserver`: the fork server DataLoader workers are forked from, preloaded with torch and Ultralytics.

This package's ``__init__`` imports nothing: spawned workers and the fork server import parts of it.
"""
