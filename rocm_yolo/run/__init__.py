"""The contract every process shares, torch-free: what a run is and which files it keeps.

The supervisor writes, the training child (and on several GPUs the DDP launcher) reads, and the other way
round, and ``rocm-yolo status`` reads from another terminal. Everything here imports neither torch nor
Ultralytics, and nothing of rocm-yolo's but :mod:`rocm_yolo.errors` and :mod:`rocm_yolo.environment`. Each
cross-process or on-disk contract is a typed record beside its codec:

- :mod:`.spec`: ``RunSpec``, everything the child needs, in one JSON file per attempt (its ``LoaderSettings``); what
  carries over from one attempt to the next (``carry_over``), and the spec on another profile (``with_profile``);
- :mod:`.devices`: the GPUs a ``device`` argument names, the run's ``Layout`` over them, and a rank's own number;
- :mod:`.nodes`: more than one machine: the nodes (in the spec), the round they agree on, a node's stop;
- :mod:`.paths`: ``RunPaths``, every file name of a run directory, and the user-level directories;
- :mod:`.atomic`: writes a reader never sees half of, never through a link; rocm-yolo's folder of a run private;
- :mod:`.weights`: the checkpoint files of ``weights/``: read inertly, verified, found, chosen for a resume;
- :mod:`.midepoch_state`: ``--checkpoint-every`` and its default, and ``MidEpochState``, rocm-yolo's record inside a
  mid-epoch checkpoint;
- :mod:`.heartbeat`: the pipe protocol: heartbeat records, position lines, a rank's exit line;
- :mod:`.supervisor_state`: ``SupervisorState``, ``supervisor.json``, the run as the supervisor wrote it (its
  ``RunState``);
- :mod:`.events`: the events file, read back, and rocm-yolo's own lines in a child's stderr;
- :mod:`.hooks`: the hook points tests and benchmarks answer (plugins named in ``ROCM_YOLO_PLUGINS``).
"""
