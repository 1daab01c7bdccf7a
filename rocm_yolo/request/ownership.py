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

On more than one machine the rule is one supervisor per node of a run: each node's supervisor
holds its node's lock (``RUN/rocm_yolo/node-K/lock``) and shares the run's lock with the other
nodes' (``LOCK_SH``), so a second supervisor for the same node is refused as above, and so is a
supervisor on one machine while the nodes train (and the other way round). ``flock`` reaches
across machines on the shared storage the run is on where that storage supports it (NFS does,
through its byte-range locks).

The run directory must be the user's own folder, not a link, and rocm-yolo's folder in it (``RUN/rocm_yolo``, each
node's) is made the user's alone (0700) before the lock is taken in it; the lock is never opened through a link.

Within one process the lock is re-entrant (the Python API may prepare a run twice).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from shlex import quote

from rocm_yolo.errors import SetupError, UsageError, option
from rocm_yolo.run.atomic import PRIVATE_FILE, check_own, open_no_link, private_dirs
from rocm_yolo.run.paths import RunPaths

_held: dict[tuple[Path, int | None], tuple[int, ...]] = {}  # (run directory, node) -> fds of the locks held


def _setup_error(what: str, path: Path, error: OSError) -> SetupError | UsageError:
    """What the file system refused, naming the file it refused (a file where a folder must be is the user's)."""
    named = Path(error.filename) if getattr(error, "filename", None) else path
    if error.errno in (errno.ELOOP, errno.EINVAL, errno.ENXIO) and named != path:  # a link or a FIFO planted there
        return UsageError(
            f"cannot {what} {path}: {named} is a symbolic link or not a regular file where rocm-yolo keeps a file of "
            "its own (it never writes through one): remove it, or choose another --name or --project"
        )
    if error.errno in (errno.EEXIST, errno.ENOTDIR) and not named.is_dir():
        return UsageError(
            f"cannot {what} {path}: {named} is a file where rocm-yolo needs a folder: move it away, or choose "
            f"another {option('name')} or {option('project')}"
        )
    advice = {
        errno.EROFS: "a run needs a writable directory: remount it read-write, or choose a writable "
        + option("project"),
        errno.ENOSPC: f"free space or choose another {option('project')}",
        errno.EDQUOT: "free space within your quota",
        errno.EACCES: f"check its permissions or choose another {option('project')}",
        errno.EPERM: f"check its permissions or choose another {option('project')}",
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


def holder(run_dir: str | os.PathLike, node: int | None = None) -> int | None:
    """The PID written by the supervisor that holds ``run_dir``'s lock (of ``node``), if one holds it now (0: held,
    no PID written)."""
    path = RunPaths(run_dir, node).lock
    try:
        fd = open_no_link(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if node is not None else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        except OSError:  # no locks on this storage: no holder to name
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _open_lock(run_dir: Path, node: int | None) -> int:
    paths = RunPaths(run_dir, node)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        check_own(run_dir)
        private_dirs(paths.state, paths.node_dir)  # the user's alone: refused in one line if another's or a link
        return open_no_link(paths.lock, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    except OSError as e:
        raise _setup_error("write to", run_dir, e) from None


def _in_use(run_dir: Path, fd: int, node: int | None) -> UsageError:
    """Why the lock of ``run_dir`` (of ``node``) is refused: who holds it."""
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    os.close(fd)
    nodes = {k: holder(run_dir, k) for k in RunPaths(run_dir, None).nodes()} if node is None else {}
    nodes = {k: pid for k, pid in nodes.items() if pid is not None}
    if nodes:
        who = ", ".join(f"node {k}" + (f" pid {pid}" if pid else "") for k, pid in nodes.items())
        return UsageError(
            f"{run_dir} is in use by the rocm-yolo supervisors of its nodes ({who}): wait for them to finish, or "
            f"stop them first (rocm-yolo status {quote(str(run_dir))})"
        )
    who = f"pid {text}" if text.isdigit() else "another process"
    mine = f" for node {node}" if node is not None else ""
    return UsageError(
        f"{run_dir} is in use by another rocm-yolo supervisor{mine} ({who}): two would overwrite each "
        f"other's checkpoints; wait for it to finish, or stop it first (rocm-yolo status {quote(str(run_dir))})"
    )


def _no_locks(run_dir: Path, error: OSError) -> SetupError:
    return SetupError(
        f"cannot lock {run_dir} ({error.strerror or error}): its storage keeps no file locks (flock), which keep a "
        "second supervisor out of a run; put the run on storage that does (NFS does; Lustre mounted with -o flock)"
    )


def acquire(run_dir: str | os.PathLike, node: int | None = None) -> None:
    """Hold ``run_dir`` (as its ``node``, on more than one machine) for this process, or raise :class:`UsageError`
    naming the holder; a run directory that is a link or another user's is refused (:func:`check_own`)."""
    check_own(run_dir)  # as named: resolved, a link would pass for the folder it points at
    run_dir = Path(run_dir).resolve()
    if (run_dir, node) in _held:
        return
    fd = _open_lock(run_dir, node)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, fd, node) from None
    except OSError as e:
        os.close(fd)
        raise _no_locks(run_dir, e) from None
    fds = (fd,)
    if node is not None:  # the run's lock, shared with the other nodes' supervisors: no one-machine supervisor
        shared = _open_lock(run_dir, None)
        try:
            fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(run_dir, shared, None) from None
        except OSError as e:
            os.close(fd)
            os.close(shared)
            raise _no_locks(run_dir, e) from None
        fds += (shared,)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the lock itself holds; the PID is only for the message above
    _held[(run_dir, node)] = fds


def release(run_dir: str | os.PathLike, node: int | None = None) -> None:
    """Let ``run_dir`` (``node``'s share of it) go (a no-op if this process does not hold it)."""
    for fd in _held.pop((Path(run_dir).resolve(), node), ()):
        os.close(fd)  # closing the last descriptor drops the flock


def held(run_dir: str | os.PathLike, node: int | None = None) -> bool:
    return (Path(run_dir).resolve(), node) in _held
