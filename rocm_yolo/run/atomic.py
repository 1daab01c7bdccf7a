"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one helper every writer of a file that someone else reads uses (heartbeat, supervisor
state, specs, the verified checkpoint copy, mid-epoch checkpoints, the self-test cache): a
temporary file in the same directory, then ``os.replace``. A file that is only ever replaced,
never written into, can be kept under a second name by a hard link made the same way
(:func:`link_atomic`: the verified copy of ``last.pt``). With ``durable=True`` the data is
fsynced before the rename and the directory after it, so a power cut or a kill during the
write never leaves a damaged file where a good one was. A failed write removes its
temporary file and raises: callers decide whether that matters.

A write that a kill cuts short leaves its temporary file (``.last.pt.PID.tmp``; on more than one
machine ``.last.pt.nK-PID.tmp``, K the node: two machines can have the same pid). The name says
whose it was (:func:`temporaries`), so that the supervisor removes those its own node's tree left
once the tree is gone, and never another node's write in progress.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Union

from rocm_yolo import environment

TEMPORARY_SUFFIX = ".tmp"
_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.(?:n(?P<node>\d+)-)?(?P<pid>\d+)\.tmp$")


def temporary(path: Path) -> Path:
    """Where a write of ``path`` goes first: a hidden file beside it, named after this process (and its node, on
    more than one machine)."""
    node = os.environ.get(environment.NODE, "")
    owner = f"n{node}-{os.getpid()}" if node.isdigit() else str(os.getpid())
    return path.with_name(f".{path.name}.{owner}{TEMPORARY_SUFFIX}")


@dataclass(frozen=True)
class Temporary:
    """A temporary file of a write (in progress, or cut short), and whose it is."""

    path: Path
    target: str  # the name of the file it becomes: last.pt, ep2-ba12.pt
    pid: int  # the process that writes it
    node: int | None  # that process's node, on more than one machine


def temporaries(directory: str | os.PathLike) -> list[Temporary]:
    """The temporary files of writes in ``directory``, in progress or cut short (nothing if it cannot be read)."""
    try:
        names = sorted(p.name for p in Path(directory).iterdir())
    except OSError:
        return []
    found = []
    for name in names:
        m = _TEMPORARY.match(name)
        if m is not None:
            node = int(m["node"]) if m["node"] is not None else None
            found.append(Temporary(Path(directory) / name, m["target"], int(m["pid"]), node))
    return found


def _sync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace(
    tmp: Path,
    path: Path,
    write: Callable[[BinaryIO], object],
    durable: bool,
    accept: Callable[[Path], bool] | None = None,
) -> bool:
    try:
        with open(tmp, "wb") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _install(tmp, path, durable, accept)


def _install(tmp: Path, path: Path, durable: bool, accept: Callable[[Path], bool] | None) -> bool:
    """The finished temporary file ``tmp`` becomes ``path`` if ``accept(tmp)`` holds (else, or on any error, it is
    removed); ``durable``: the directory fsynced after the rename. Whether it did."""
    try:
        if accept is not None and not accept(tmp):
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _sync_dir(path.parent)
    return True


def write_atomic(
    path: str | os.PathLike, data: Union[str, bytes, Callable[[BinaryIO], object]], *, durable: bool = False
) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; ``durable`` also fsyncs.

    ``data`` may also be a function that writes into the open binary file (e.g. ``torch.save``),
    so a large payload need not be held in memory a second time.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    write = payload if callable(payload) else (lambda f: f.write(payload))
    _replace(temporary(path), path, write, durable)


def copy_atomic(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    durable: bool = False,
    accept: Callable[[Path], bool] | None = None,
) -> bool:
    """Copy ``src`` to ``dst`` atomically (``durable``: fsynced). With ``accept``, the copy replaces ``dst`` only if
    ``accept(the temporary copy)`` holds (what is checked is then exactly what ``dst`` gets); whether it did."""
    dst = Path(dst)

    def copy(fout: BinaryIO) -> None:
        with open(src, "rb") as fin:
            shutil.copyfileobj(fin, fout, 1 << 20)

    return _replace(temporary(dst), dst, copy, durable, accept)


def link_atomic(src: str | os.PathLike, dst: str | os.PathLike, *, accept: Callable[[Path], bool]) -> bool | None:
    """Make ``dst`` a hard link to ``src``'s file, atomically (a link beside ``dst``, renamed over it; the directory
    fsynced), if ``accept(the link)`` holds: True, or False where it does not; None where no link can be made here
    (another file system, one without hard links): the caller copies. Only for a ``src`` whose writers replace it
    (temporary file, rename) rather than write into it: a write into ``src`` would change ``dst`` too."""
    dst = Path(dst)
    tmp = temporary(dst)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        return None
    return _install(tmp, dst, True, accept)


def replace_durably(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Make the finished temporary file ``tmp`` the file ``path``: fsynced, renamed over it, the directory fsynced."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _sync_dir(Path(path).parent)


def remove_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files a killed writer left in ``directory``; the ones removed."""
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for p in entries:
        if p.name.startswith(".") and p.name.endswith(TEMPORARY_SUFFIX):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                continue
    return removed
