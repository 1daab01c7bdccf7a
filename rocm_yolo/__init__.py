"""rocm-yolo: dependable Ultralytics YOLO training on AMD GPUs with ROCm.

``rocm_yolo.train(data=..., workers=4, profile="fast", ...)`` runs the same supervised child
process as ``rocm-yolo train``. Importing this package imports neither torch nor ultralytics.

The entrances: :mod:`.cli` (``rocm-yolo``; ``python -m rocm_yolo``), :mod:`.api` (``rocm_yolo.train``)
and :mod:`.status`; the bottom of the house: :mod:`.environment` (every variable), :mod:`.errors`
(exit codes) and :mod:`.triage` (whose failure an exception is). The folders: :mod:`.launch`,
:mod:`.run`, :mod:`.supervisor`, :mod:`.diagnosis`, :mod:`.process`, :mod:`.trainer`, :mod:`.gpu`, :mod:`.conv`,
:mod:`.doctor`, :mod:`.ultralytics_rules`, :mod:`.patches` and the testing plugin :mod:`.testing`
(CONTRIBUTING.md draws the house).
"""

__version__ = "0.1.0"
__all__ = ["train", "UsageError", "__version__"]


def __getattr__(name):  # PEP 562: keep `import rocm_yolo` light (spawned workers import it too)
    if name == "train":
        from rocm_yolo.api import train

        return train
    if name == "UsageError":
        from rocm_yolo.errors import UsageError

        return UsageError
    raise AttributeError(f"module 'rocm_yolo' has no attribute {name!r}")
