"""rocm-yolo: dependable Ultralytics YOLO training on AMD GPUs with ROCm.

``rocm_yolo.train(data=..., workers=4, profile="fast", ...)`` runs the same supervised child
process as ``rocm-yolo train``. Importing this package imports neither torch nor ultralytics.

The entrances: :mod:`.cli` (``rocm-yolo``; ``python -m rocm_yolo``), :mod:`.api` (``rocm_yolo.train``)
and :mod:`.status`; the bottom of the house: :mod:`.environment` (every variable), :mod:`.errors`
(exit codes), :mod:`.triage` (whose failure an exception is) and :mod:`.version`; a child's failure before its work
starts, as one line and an exit code: :mod:`.setup_failure` (the trainer's, the DDP launcher's). The folders:
:mod:`.request`, :mod:`.policy`, :mod:`.run`, :mod:`.supervisor`, :mod:`.ddp`, :mod:`.diagnosis`, :mod:`.process`,
:mod:`.trainer`, :mod:`.gpu`, :mod:`.conv`, :mod:`.doctor`, :mod:`.ultralytics_rules`, :mod:`.patches` and the
testing plugin :mod:`.testing` (CONTRIBUTING.md draws the house).
"""

from rocm_yolo.version import __version__

__all__ = ["train", "UsageError", "SetupError", "__version__"]


class _Checkout:
    """Finds ``rocm_yolo.patches`` in a checkout: ``patches/`` beside this package, where pyproject.toml's
    ``package-dir`` maps it for a wheel and an editable install. Needed where the checkout itself is on
    ``sys.path``: no install (``PYTHONPATH=.``), or ``python -m`` run in the clone, which puts it before an
    installed wheel (``make test``'s pytest, the trainer of ``make demo``)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != "rocm_yolo.patches":
            return None
        import os
        from importlib.util import spec_from_file_location

        patches = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "patches")
        init = os.path.join(patches, "__init__.py")
        if not os.path.isfile(init):
            return None
        return spec_from_file_location(fullname, init, submodule_search_locations=[patches])


def _find_patches_in_a_checkout() -> None:
    """Only where this package has no ``patches/`` of its own (a wheel's has), and first on ``sys.meta_path``: the
    patches are those beside this package, never another clone's that an editable install maps."""
    import os
    import sys

    if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "patches")):
        if _Checkout not in sys.meta_path:
            sys.meta_path.insert(0, _Checkout)


_find_patches_in_a_checkout()


def __getattr__(name):  # PEP 562: keep `import rocm_yolo` light (spawned workers import it too)
    if name == "train":
        from rocm_yolo.api import train

        return train
    if name in ("UsageError", "SetupError"):  # what rocm_yolo.train raises before anything starts
        from rocm_yolo import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'rocm_yolo' has no attribute {name!r}")
