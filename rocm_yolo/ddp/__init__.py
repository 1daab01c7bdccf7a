"""More than one GPU, or machine: the DDP launcher, between the supervisor and torch's agent (torch-free).

Started by the supervisor as ``python -m rocm_yolo.ddp SPEC.json`` in place of the training child
whenever a run launches ranks (:func:`rocm_yolo.run.devices.launches_ranks`), in its own session. It
starts torch's agent (``torch.distributed.run``, as torch elastic calls it), which starts one rank per
GPU of this node, each a training child (``python -m rocm_yolo.trainer SPEC.json``; what differs in a
rank: :mod:`rocm_yolo.trainer.rank`).

- :mod:`.launcher`: the process entry; torch's agent started, waited for, and its outcome as one exit code;
- :mod:`.relay`: the ranks' heartbeats, through a FIFO into the supervisor's pipe, and each rank's exit code;
- :mod:`.torchrun`: ``torch.distributed.run`` with its own reports in the run's ``torchrun.log`` (torch's agent);
- :mod:`.rendezvous`: more than one machine: torch's c10d rendezvous, its rounds, the wait and the nodes missing.

This package's ``__init__`` imports nothing.
"""
