"""Files written safely: atomically (a reader sees the old file or the new one, never half of one), never through a
link someone else planted, and the run's own state private to its user.

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

No file of a run is written through a link: every open here uses ``O_NOFOLLOW`` (a link planted where a log, a
lock or a temporary file goes is refused, ELOOP, never followed to the file it names), a temporary file is also
created with ``O_CREAT|O_EXCL`` (a file already there under its name is removed first, never written into), and
only a regular file is opened (a FIFO planted there would block the writer). rocm-yolo's own folder of a run
(``RUN/rocm_yolo``, each node's folder in it, ``stacks/``) is made :func:`private_dir`: the user's, not a link, mode
0700 whatever the umask; a file created in such a folder is 0600 (:func:`file_mode`), elsewhere what ``open()``
gives a new file (0666 less the umask: the user's weights and results keep the user's umask). Reports meant to be
read by others of the user's group (``crash-K.txt``) are 0640 (:data:`REPORT_FILE`). Logs rotate past
:data:`LOG_LIMIT` (:func:`append_log`: the older part in ``NAME.1``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Union

from rocm_yolo import environment
from rocm_yolo.environment import untrusted
from rocm_yolo.errors import UsageError

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


PRIVATE_DIR = 0o700  # rocm-yolo's folder of a run, each node's, stacks/: the user's alone
PRIVATE_FILE = 0o600  # a file created in such a folder
REPORT_FILE = 0o640  # a crash, setup or internal report beside the weights: the user's group may read it
LOG_LIMIT = 10 << 20  # a log past about 10 MiB rotates: its older part becomes NAME.1 (the one before goes)
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a FIFO planted there does not block the open


def file_mode(directory: str | os.PathLike) -> int:
    """The mode of a file created in ``directory``: 0600 in a folder only its owner may enter (rocm-yolo's state),
    else 0666, which the umask trims as for any new file."""
    try:
        shared = os.stat(directory).st_mode & 0o077
    except OSError:
        return 0o666
    return 0o666 if shared else PRIVATE_FILE


def open_no_link(path: str | os.PathLike, flags: int, mode: int | None = None) -> int:
    """``os.open`` of a regular file, never through a symbolic link at ``path`` (OSError ELOOP). A file it creates
    gets ``mode`` (default :func:`file_mode` of its folder); a private mode is set exactly, whatever the umask, also
    on a file of the user's that was there with a wider one."""
    path = Path(path)
    mode = file_mode(path.parent) if mode is None else mode
    fd = os.open(path, flags | _NO_LINK, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if mode != 0o666 and stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():
            os.fchmod(fd, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: str | os.PathLike, mode: int | None = None, text: bool = True):
    """``path`` opened to append (created if missing; see :func:`open_no_link`), as a Python file."""
    fd = open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    return os.fdopen(fd, "a", encoding="utf-8") if text else os.fdopen(fd, "ab")


def append_log(path: str | os.PathLike, data: str | bytes, limit: int = LOG_LIMIT) -> None:
    """Append ``data`` to the log ``path``; past ``limit`` bytes the log first rotates: it becomes ``NAME.1`` (the
    one before is dropped) and a new one starts. Several processes may append: each write is one ``O_APPEND``."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd = open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        st = os.fstat(fd)
        if st.st_size and st.st_size + len(payload) > limit and _same_file(path, st):
            os.close(fd)
            fd = -1
            os.replace(path, rotated(path))
            fd = open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, payload)
    finally:
        if fd >= 0:
            os.close(fd)


def rotated(path: str | os.PathLike) -> Path:
    """Where a log's older part goes when it rotates: ``events.jsonl.1``."""
    return Path(f"{path}.1")


def _same_file(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` still names the file ``st`` describes (another process may have rotated it meanwhile)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def write_report(path: str | os.PathLike, text: str, mode: int = REPORT_FILE, limit: int = LOG_LIMIT) -> Path:
    """Write a report (a traceback, a hang's stacks) to ``path``, 0640, never through a link; cut to ``limit``
    bytes (the end kept: a hang's last processes, a traceback's last frames)."""
    data = text.encode("utf-8", "replace")
    if len(data) > limit:
        data = b"[... the beginning dropped: the report is cut to its last %d bytes ...]\n" % limit + data[-limit:]
    fd = open_no_link(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(path)


def check_own(path: str | os.PathLike, what: str = "the run directory") -> None:
    """UsageError (one line, exit 2) when ``path`` is a link or another user's: a run's files are the user's."""
    why = untrusted(path)
    if why is not None:
        raise UsageError(
            f"{what} {path} {why}: rocm-yolo keeps a run only in a folder of the user's own (not a link); remove it "
            "or choose another --name or --project"
        )


def check_cache(path: str | os.PathLike, what: str) -> None:
    """UsageError (one line, exit 2) when ``path`` in rocm-yolo's cache, or a folder above it in the cache, is a link
    or another user's: what another user put there (MIOpen's kernels, the demo set) is never used."""
    why = environment.cache_problem(path)
    if why is not None:
        raise UsageError(
            f"{what} in rocm-yolo's cache cannot be used: {why}; remove it, or set {environment.CACHE_DIR} to a folder "
            "of your own"
        )


def private_dir(path: str | os.PathLike) -> Path:
    """rocm-yolo's own folder ``path``: made if missing (a missing parent as any folder), the user's, not a link, mode
    0700 whatever the umask; UsageError (one line) otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        pass
    check_own(path, "rocm-yolo's folder")
    if not path.is_dir():
        raise UsageError(f"{path} is a file where rocm-yolo keeps its own folder: move it away, or choose another name")
    if stat.S_IMODE(os.lstat(path).st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)
    return path


def private_dirs(*paths: str | os.PathLike) -> Path:
    """:func:`private_dir` of each of ``paths``, in order (a folder, then one inside it); the last."""
    for path in paths:
        last = private_dir(path)
    return last


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


def create_temporary(tmp: str | os.PathLike, mode: int | None = None) -> int:
    """Create the temporary file ``tmp`` (``O_CREAT|O_EXCL``, never through a link): whatever was there under its name
    (a write of a killed process with the same pid, or a link someone planted) is removed first, not written into.
    Returns its descriptor, open to write."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return open_no_link(tmp, flags, mode)
    except FileExistsError:
        os.unlink(tmp)  # the name only: a link goes, what it points at stays
        return open_no_link(tmp, flags, mode)


def _replace(
    tmp: Path,
    path: Path,
    write: Callable[[BinaryIO], object],
    durable: bool,
    accept: Callable[[Path], bool] | None = None,
) -> bool:
    try:
        with os.fdopen(create_temporary(tmp, file_mode(path.parent)), "wb") as f:
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
