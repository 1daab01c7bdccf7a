"""Finding, verifying and keeping good checkpoints, without importing torch.

Ultralytics writes ``last.pt`` with a plain ``write_bytes``: a kill in the middle leaves it
truncated. A torch checkpoint is a zip archive whose central directory sits at the end and
whose members carry CRCs, so :func:`verify` can tell a complete file from a truncated or
damaged one by reading it once, with the standard library. After every save the training
child keeps a verified copy, ``last_good.pt`` (a hard link where the saves replace ``last.pt``
whole, else a copy), made atomically; resume falls back to it. A finished run keeps none.

Mid-epoch checkpoints (``weights/ep{E}-ba{B}.pt``, written by :mod:`rocm_yolo.trainer.midepoch.save`) are
named by their position, so the newest one is known without opening it. The training child
deletes those of an epoch once that epoch's ``last.pt`` is saved and verified, so a valid
mid-epoch file is newer than ``last.pt``; :func:`choose_resume_point` only falls back on
modification times when a kill interrupted that clean-up.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.run.atomic import copy_atomic, link_atomic, untrusted
from rocm_yolo.run.paths import GOOD_NAME, RunPaths

# --------------------------------------------------------------------------- reading a checkpoint inertly
# A torch checkpoint is a zip archive: ``ARCHIVE/data.pkl`` pickles the object tree and names each tensor's
# storage by key; the storages are ``ARCHIVE/data/KEY``. :class:`InertUnpickler` reads ``data.pkl`` with every
# class replaced by an inert stub and every storage by its key, so nothing is imported or run. That is enough
# to tell whether every record the pickle names is in the file (what ``torch.load`` needs:
# :func:`missing_records`), and to read plain fields (:func:`read_inert`; Ultralytics' own:
# :mod:`rocm_yolo.ultralytics_rules.checkpoint`).


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


def read_inert(path: str | os.PathLike) -> object | None:
    """The object a checkpoint pickles, with stubs for classes and None for tensors; None when it cannot be read."""
    try:
        with zipfile.ZipFile(path) as z:
            obj, _, _ = load(z)
    except Exception:  # noqa: BLE001 - damaged or foreign: the caller decides
        return None
    return obj


# --------------------------------------------------------------------------- verifying, finding, choosing


def verify(path: str | os.PathLike) -> str | None:
    """``None`` when ``path`` is a checkpoint ``torch.load`` will read, else the reason it is not.

    Checked as torch reads it: a zip archive whose members are whole (CRCs), with a ``data.pkl``
    whose every storage record is present (a stop inside ``torch.save`` can leave a well-formed
    archive that lacks some). The pickle is read inertly (:class:`InertUnpickler`):
    nothing it names is imported or run. Never raises: any failure is a reason to fall back. A file that is not the
    user's own (another user's, or a link) is no checkpoint to resume from: Ultralytics would unpickle it whole.
    """
    p = Path(path)
    why = untrusted(p)
    if why is not None:
        return f"not the user's own file: it {why}"
    try:
        if not p.is_file():
            return "no such file"
        if p.stat().st_size == 0:
            return "empty file"
        with zipfile.ZipFile(p) as z:
            try:
                missing, named = missing_records(z)
            except KeyError:
                return "not a torch checkpoint (no data.pkl)"
            if missing:
                return f"incomplete: {len(missing)} of its {named} tensor records are missing (e.g. data/{missing[0]})"
            bad = z.testzip()
            if bad is not None:
                return f"damaged member {bad}"
    except zipfile.BadZipFile:
        return "truncated or not a torch checkpoint"
    except Exception as e:  # noqa: BLE001 - an unknown compression method, a broken pickle, an I/O error
        return f"unreadable ({e.__class__.__name__}: {e})"
    return None


def keep_good_copy(last: str | os.PathLike, *, link: bool = False) -> Path | None:
    """Keep ``last`` as ``last_good.pt`` beside it if it verifies, atomically: what is checked is the file kept,
    whatever happens to ``last`` meanwhile. ``link``: ``last`` is only ever replaced whole (its saves write a
    temporary file and rename it), so the copy is a hard link to the same file, which costs no write (a copy where
    no link can be made); else a durable copy. The copy, or None (the previous one is kept)."""
    last = Path(last)
    good = last.with_name(GOOD_NAME)
    accept = lambda tmp: verify(tmp) is None  # noqa: E731
    linked = link_atomic(last, good, accept=accept) if link else None
    if linked is not None:
        return good if linked else None
    return good if copy_atomic(last, good, durable=True, accept=accept) else None


def find_latest(project: str | os.PathLike) -> Path | None:
    """The ``weights/last.pt`` of the run under ``project`` with the newest checkpoint (by modification time).

    A run left with only its verified copy or only mid-epoch checkpoints (a hang in its first
    epoch) counts: the path returned is then the ``last.pt`` it does not have yet. Only the user's own runs count:
    a checkpoint, ``weights/`` folder or run folder of another user's, or a link, is passed over.
    """
    root = Path(project)
    if not root.is_dir():
        return None
    newest: dict[Path, float] = {}
    for pattern in ("last.pt", GOOD_NAME, "ep*-ba*.pt"):
        for p in root.glob(f"**/weights/{pattern}"):
            if any(untrusted(x) for x in (p, p.parent, p.parent.parent)):
                continue  # another user's run (or a link to one) under a shared project folder
            try:
                mtime = p.stat().st_mtime
            except OSError:
                continue
            last = p.with_name("last.pt")
            newest[last] = max(newest.get(last, mtime), mtime)
    return max(newest, key=newest.get, default=None)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resume starts: the checkpoint, a note when it is not ``last.pt``, a damaged ``last.pt`` to move
    aside (never delete) before the run goes on, and for a finished run that trains further, the copy that
    becomes ``last.pt`` again (``reopen``: the verified copy kept with the optimizer)."""

    path: Path
    note: str | None = None
    aside: Path | None = None
    reopen: Path | None = None

    def take(self) -> tuple[Path, str | None]:
        """Move the damaged file aside, or reopen a finished run (the run is held by now); the checkpoint and
        the note."""
        if self.reopen is not None:  # last.pt, stripped at the end of training, is the kept copy again
            copy_atomic(self.reopen, self.path, durable=True)
            return self.path, self.note
        if self.aside is not None and self.aside.exists():
            kept = self.aside.with_name(self.aside.stem + ".truncated.pt")
            os.replace(self.aside, kept)
            return self.path, f"{self.note} (the damaged file was kept as {kept.name})"
        return self.path, self.note


def plan_resume(last: str | os.PathLike) -> ResumePoint:
    """The end-of-epoch checkpoint to resume from for ``last``: itself, or its verified copy. Changes nothing.

    Raises :class:`UsageError` when neither is usable.
    """
    last = Path(last)
    reason = verify(last)
    if reason is None:
        return ResumePoint(last)
    good = last.with_name(GOOD_NAME)
    if verify(good) is None:
        note = f"{last} is unusable ({reason}); resuming from the verified copy {good}"
        return ResumePoint(good, note, last if last.exists() else None)
    if reason == "no such file":
        raise UsageError(f"checkpoint not found: {last}")
    raise UsageError(f"checkpoint {last} is unusable ({reason}) and no verified copy exists: start a new run")


def choose_resume(last: str | os.PathLike) -> tuple[Path, str | None]:
    """:func:`plan_resume`, taken: a truncated ``last.pt`` is moved aside and the verified copy is used."""
    return plan_resume(last).take()


def newest_mid_checkpoint(paths: RunPaths) -> tuple[Path | None, list[str]]:
    """The valid mid-epoch checkpoint of the furthest position, and a note for each damaged one skipped."""
    notes = []
    for epoch, batches, path in reversed(paths.mid_checkpoints()):
        reason = verify(path)
        if reason is None:
            return path, notes
        notes.append(f"skipped the mid-epoch checkpoint {path.name}: {reason}")
    return None, notes


def plan_resume_point(last: str | os.PathLike) -> ResumePoint:
    """The newest valid checkpoint of ``last``'s run, mid-epoch or end of epoch. Changes nothing.

    A valid mid-epoch checkpoint is newer than ``last.pt`` (the child deletes them once an epoch's
    ``last.pt`` is verified), unless a kill interrupted that clean-up: then ``last.pt`` is the
    newer file, which its modification time shows. Raises :class:`UsageError` when nothing is usable.
    """
    last = Path(last)
    mid, notes = newest_mid_checkpoint(RunPaths(last.parent.parent))
    if mid is not None:
        end_is_newer = verify(last) is None and last.stat().st_mtime > mid.stat().st_mtime
        if not end_is_newer:
            notes.append(f"resuming from the mid-epoch checkpoint {mid.name}, the newest valid checkpoint of the run")
            return ResumePoint(mid, "; ".join(notes))
    point = plan_resume(last)
    notes += [point.note] if point.note else []
    return ResumePoint(point.path, "; ".join(notes) or None, point.aside)


def choose_resume_point(last: str | os.PathLike) -> tuple[Path, str | None]:
    """:func:`plan_resume_point`, taken: the checkpoint and a note when it is not ``last`` itself."""
    return plan_resume_point(last).take()


def is_mid_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    return any(found == p for _, _, found in RunPaths(p.parent.parent).mid_checkpoints())


def remove_mid_checkpoints(
    paths: RunPaths, *, through_epoch: int | None = None, keep: Path | None = None
) -> list[Path]:
    """Delete mid-epoch checkpoints of epochs <= ``through_epoch`` (1-based; None: all), except ``keep``."""
    removed = []
    for epoch, _, path in paths.mid_checkpoints():
        if (through_epoch is None or epoch <= through_epoch) and path != keep:
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                continue
    return removed
