"""What Ultralytics' resume lets a user change: ``BaseTrainer.check_resume``'s whitelist.

A resume reloads the run's saved train arguments and applies only the keys of
:data:`RESUME_ALLOWED` from the new ones (``data`` too: a moved data set); every other key is
dropped with Ultralytics' "Resume ignores [...]" warning, ``epochs`` and ``amp`` included.
rocm-yolo's own callbacks set ``workers``, ``val`` and the presets on the trainer whatever this
list holds (:mod:`rocm_yolo.trainer.callbacks.trainer_settings`). :mod:`.compat` checks the list against
the installed ``check_resume``.
"""

RESUME_ALLOWED = frozenset(
    {
        "imgsz",
        "batch",
        "device",
        "close_mosaic",
        "augmentations",
        "save_period",
        "workers",
        "cache",
        "patience",
        "time",
        "freeze",
        "val",
        "plots",
        "channels_last",
        "distill_model",
        "save_dir",
    }
)
RESUME_REPORTED = (
    "epochs",
    "workers",
    "val",
    "batch",
    "imgsz",
    "device",
)  # the resume line names these when they change
