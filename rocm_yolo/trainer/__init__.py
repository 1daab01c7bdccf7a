"""The training child: the one process that imports torch and Ultralytics and trains.

Started fresh by the supervisor as ``python -m rocm_yolo.trainer SPEC.json`` (never forked
from a process that imported torch), it orders the steps that make DataLoader workers safe
(:mod:`.child`), sets up the environment, the fork server and the patches (:mod:`.setup`),
trains with rocm-yolo's callbacks (:mod:`.run`) and turns every failure into one line and
an exit code (:mod:`.failures`).

- :mod:`.compat`: every Ultralytics and torch internal rocm-yolo relies on, checked at start-up;
- :mod:`.forkserver`, :mod:`.preload`: DataLoader workers forked from a preloaded server;
- :mod:`.callbacks`: the registry of callback events; :mod:`.run_hooks`, :mod:`.heartbeat`: callbacks;
- :mod:`.checkpoint_state`, :mod:`.checkpoint_save`, :mod:`.checkpoint_resume`: mid-epoch checkpoints;
- :mod:`.sample_order`: the training samples' order, recorded and replayed;
- :mod:`.resume`: what a resume passes to Ultralytics, and where inside an epoch it continues.

This package's ``__init__`` imports nothing: spawned workers and the fork server import parts of it.
"""
