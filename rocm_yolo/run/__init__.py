"""The contract both processes share, torch-free: what a run is and which files it keeps.

The supervisor writes, the training child reads (and the other way round), and ``rocm-yolo
status`` reads from another terminal. Everything here imports neither torch nor Ultralytics.

- :mod:`.spec`: ``RunSpec``, everything the child needs, in one JSON file per attempt;
- :mod:`.profiles`: the settings profiles and the one place loader settings are validated;
- :mod:`.interval`: ``--checkpoint-every`` and its default;
- :mod:`.paths`: ``RunPaths``, every file name of a run directory, and the user's cache;
- :mod:`.atomic`: writes a reader never sees half of;
- :mod:`.ownership`: one supervisor per run directory (claim and lock);
- :mod:`.checkpoints`: checkpoint files: verified, found, chosen for a resume;
- :mod:`.heartbeat`: the heartbeat record the child sends and the supervisor reads;
- :mod:`.state`: ``supervisor.json``, the run's state as the supervisor last wrote it;
- :mod:`.events`: the run log and the events file;
- :mod:`.lifecycle`: how a child of the supervisor lives and dies (signals, environment names);
- :mod:`.hooks`: the one door into :mod:`rocm_yolo.testing`, open only when its variables are set.
"""
