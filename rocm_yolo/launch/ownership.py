"""One supervisor per run directory.

Two supervisors writing one run directory interleave ``results.csv``, overwrite each
other's checkpoints and delete each other's verified copies. So:

- a new run **claims** its directory atomically: ``mkdir`` without ``exist_ok``, and on a
  collision the next free name in Ultralytics' own numbering (``train``, ``train-2``,
  ``train-3``, ...). Processes started at the same instant get different directories.
- a supervisor holds an exclusive **lock** (``fcntl.flock`` on ``RUN/rocm_yolo/lock``) for
  its whole life, across restarts. A second one (``--resume`` of a live run, or
  ``exist_ok=True`` onto it) is refused at once with the holder's PID, before anything in
  the directory is touched. The kernel drops the lock when its holder dies, however it
  dies: a stale lock file from a dead supervisor is not a lock.

Within one process the lock is re-entrant (the Python API may prepare a run twice).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from rocm_yolo.errors import SetupError, UsageError
from rocm_yolo.run.paths import RunPaths

_held: dict[Path, int] = {}  # run directory -> fd of the lock this process holds


def _setup_error(what: str, path: Path, error: OSError) -> SetupError | UsageError:
    """What the file system refused, naming the file it refused (a file where a folder must be is the user's)."""
    named = Path(error.filename) if getattr(error, "filename", None) else path
    if error.errno in (errno.EEXIST, errno.ENOTDIR) and not named.is_dir():
        return UsageError(
            f"cannot {what} {path}: {named} is a file where rocm-yolo needs a folder: move it away, or choose "
            "another --name or --project"
        )
    advice = {
        errno.EROFS: "a run needs a writable directory: remount it read-write, or choose a writable --project",
        errno.ENOSPC: "free space or choose another --project",
        errno.EDQUOT: "free space within your quota",
        errno.EACCES: "check its permissions or choose another --project",
        errno.EPERM: "check its permissions or choose another --project",
    }.get(error.errno, "check the directory")
    where = f" ({named}: {error.strerror})" if named != path and error.strerror else f" ({error.strerror or error})"
    return SetupError(f"cannot {what} {path}{where}: {advice}")


def claim_run_dir(project: Path, name: str) -> Path:
    """Create and return a new run directory ``project/name`` (or ``name-2``, ``name-3``, ...)."""
    try:
        project.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _setup_error("create the project directory", project, e) from None
    n = 1
    while True:
        path = project / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
        except OSError as e:
            raise _setup_error("create the run directory", path, e) from None


def holder(run_dir: str | os.PathLike) -> int | None:
    """The PID written by the supervisor that holds ``run_dir``'s lock, if one holds it now."""
    path = RunPaths(run_dir).lock
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def acquire(run_dir: str | os.PathLike) -> None:
    """Hold ``run_dir`` for this process, or raise :class:`UsageError` naming the holder."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    paths = RunPaths(run_dir)
    try:
        paths.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise _setup_error("write to", run_dir, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f"pid {text}" if text.isdigit() else "another process"
        raise UsageError(
            f"{run_dir} is in use by another rocm-yolo supervisor ({who}): two would overwrite each "
            f"other's checkpoints; wait for it to finish, or stop it first (rocm-yolo status {run_dir})"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the lock itself holds; the PID is only for the message above
    _held[run_dir] = fd


def release(run_dir: str | os.PathLike) -> None:
    """Let ``run_dir`` go (a no-op if this process does not hold it)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor drops the flock


def held(run_dir: str | os.PathLike) -> bool:
    return Path(run_dir).resolve() in _held
