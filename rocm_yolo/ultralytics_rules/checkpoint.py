"""Ultralytics' checkpoint files, read without torch and without running any code they name.

A torch checkpoint is a zip archive: ``ARCHIVE/data.pkl`` pickles the object tree and names
each tensor's storage by key; the storages are ``ARCHIVE/data/KEY``. :class:`InertUnpickler`
reads ``data.pkl`` with every class replaced by an inert stub and every storage by its key,
so nothing is imported or run. That is enough to tell whether every record the pickle names
is in the file (what ``torch.load`` needs: :func:`missing_records`), and to read the plain
fields of Ultralytics' checkpoint dict: ``epoch``, ``train_args``, the mid-epoch position.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

MID_EPOCH_KEY = "rocm_yolo_mid_epoch"  # rocm-yolo's key: the position inside the epoch (trainer.checkpoint_state)


class Stub:
    """Stands for any class a checkpoint names: built from anything, keeps only its state."""

    def __init__(self, *args, **kwargs):
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def __call__(self, *args, **kwargs):
        return Stub()

    def __setitem__(self, key, value):  # dict-like classes (OrderedDict) get their items set
        pass

    def append(self, value):  # list-like ones get appended to
        pass

    def extend(self, values):
        pass


class InertUnpickler(pickle.Unpickler):
    """Reads a torch checkpoint's ``data.pkl`` without importing or running anything it names.

    ``storages`` collects the key of every tensor storage the pickle references.
    """

    def __init__(self, file):
        super().__init__(file)
        self.storages: set[str] = set()

    def find_class(self, module, name):
        return Stub

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and len(pid) > 2 and pid[0] == "storage":
            self.storages.add(str(pid[2]))  # ("storage", storage type, key, location, numel)
        return None


def state_of(obj) -> dict:
    """The ``__dict__`` a stub was given (a module's attributes), or {}."""
    state = getattr(obj, "state", None)
    if isinstance(state, tuple):  # (dict, slots)
        state = next((s for s in state if isinstance(s, dict)), None)
    return state if isinstance(state, dict) else {}


def _pickle_name(z: zipfile.ZipFile) -> str | None:
    return next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)


def load(z: zipfile.ZipFile) -> tuple[object, set[str], str]:
    """(the checkpoint object with stubs for classes, the storage keys it names, the archive's prefix).

    Raises ``KeyError`` when there is no ``data.pkl``, and whatever unpickling a damaged one raises.
    """
    name = _pickle_name(z)
    if name is None:
        raise KeyError("data.pkl")
    with z.open(name) as f:
        unpickler = InertUnpickler(f)
        obj = unpickler.load()
    return obj, unpickler.storages, name[: -len("data.pkl")]


def missing_records(z: zipfile.ZipFile) -> tuple[list[str], int]:
    """(the storage records the pickle names that the archive lacks, how many it names)."""
    _, keys, prefix = load(z)
    names = set(z.namelist())
    return sorted(k for k in keys if f"{prefix}data/{k}" not in names), len(keys)


@dataclass(frozen=True)
class Summary:
    """The plain fields of an Ultralytics checkpoint that decide what a resume does."""

    epoch: int | None  # the last completed epoch (0-based); -1 once the optimizer was stripped (a finished run)
    epochs: int | None  # the run's train_args epochs
    mid_epoch: bool  # a rocm-yolo mid-epoch checkpoint
    task: str | None
    train_args: dict

    @property
    def finished(self) -> bool:
        """Every epoch is trained: Ultralytics' resume would refuse it."""
        return finished(self.epoch, self.epochs, self.mid_epoch)


def finished(epoch, epochs, mid_epoch: bool) -> bool:
    """Whether a checkpoint with these fields belongs to a run that has trained all its epochs."""
    if mid_epoch:
        return False
    return epoch is None or epoch < 0 or bool(epochs and epoch + 1 >= epochs)


def summary(path: str | Path) -> Summary | None:
    """The :class:`Summary` of the checkpoint at ``path``; None when it cannot be read."""
    try:
        with zipfile.ZipFile(path) as z:
            ckpt, _, _ = load(z)
    except Exception:  # noqa: BLE001 - damaged or foreign: the caller decides
        return None
    if not isinstance(ckpt, dict):
        return None
    args = ckpt.get("train_args") if isinstance(ckpt.get("train_args"), dict) else {}
    epoch = ckpt.get("epoch")
    epochs = args.get("epochs")
    return Summary(
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        epochs=epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None,
        mid_epoch=isinstance(ckpt.get(MID_EPOCH_KEY), dict),
        task=_task(ckpt, args),
        train_args=args,
    )


def _task(ckpt: dict, args: dict) -> str | None:
    from rocm_yolo.ultralytics_rules.tasks import TASKS, head_task

    if args.get("task") in TASKS:
        return args["task"]
    for key in ("model", "ema"):
        state = state_of(ckpt.get(key))
        model_args = state.get("args")
        if isinstance(model_args, dict) and model_args.get("task") in TASKS:
            return model_args["task"]
        found = head_task(state.get("yaml")) if isinstance(state.get("yaml"), dict) else None
        if found:
            return found
    return None
