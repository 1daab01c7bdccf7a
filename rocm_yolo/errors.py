"""Errors and exit codes, in one place.

Three kinds of failure reach a user, each as one line on the terminal and never as a
Python traceback:

- a **user error** (:class:`UsageError`): bad arguments, data or checkpoint, found by a
  check that knows what it is looking at. Exit 2; nothing started or changed.
- an **environment or setup error** (:class:`SetupError`): torch or the GPU runtime is
  broken, a library is missing, the disk is full or read-only, a download is needed while
  offline. Exit 4; never retried (a restart would meet it again); the traceback goes to
  ``RUN/setup-K.txt`` where a run directory exists.
- an **internal error**: anything else is a rocm-yolo bug. Exit 123 (as black's), the
  traceback kept in the run directory (``RUN/internal-K.txt``) or the cache, and the line
  says where.

:func:`classify` tells them apart for an exception raised by Ultralytics or torch, by what
the exception is *and* where it was raised, not by its type alone: a ``KeyError`` from a
bug is internal, a ``FileNotFoundError`` from Ultralytics' data set check is the user's.

This module is imported by the CLI and the training child: it imports nothing heavy.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

# --------------------------------------------------------------------------- exit codes

OK = 0  # training done
FAILED = 1  # failed after the allowed restarts, or a training error
USAGE = 2  # bad arguments, data or checkpoint: nothing was started or changed
SETUP = 4  # the environment is broken (torch, GPU runtime, disk full or read-only, offline): not retried
INTERNAL = 123  # a rocm-yolo bug: the traceback is kept and the line says where
HANGUP = 129  # SIGHUP: the terminal went away
PIPE_CLOSED = 141  # the reader of the output went away (as a command killed by SIGPIPE exits)
INTERRUPTED = 130  # Ctrl-C (SIGINT)
TERMINATED = 143  # SIGTERM

# Between the supervisor and its child only:
CHILD_FINISHED = 3  # the checkpoint to resume belongs to a run that has already finished

HELP = (
    "exit codes: 0 done; 1 failed after retries or a training error; 2 usage error; "
    "4 environment/setup error (not retried); 123 internal error (a rocm-yolo bug); "
    "129/130/143 stopped by SIGHUP/Ctrl-C/SIGTERM"
)

# --------------------------------------------------------------------------- error classes

USER, ENVIRONMENT, INTERNAL_KIND = "user", "environment", "internal"


class UsageError(ValueError):
    """A user error: a bad flag, KEY=VALUE, path, data set, checkpoint or profile. One line, exit 2."""

    exit_code = USAGE


class SetupError(RuntimeError):
    """The environment keeps training from starting (or going on). One line, exit 4, never retried."""

    exit_code = SETUP


# Full or read-only disks and quotas: a restart cannot help, and the supervisor stops.
DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}
_ENV_ERRNOS = DISK_ERRNOS | {errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE}

# Messages of the GPU runtimes (HIP, CUDA, MIOpen) and of downloads while offline.
_GPU_RUNTIME = re.compile(
    r"HIP error|hipError|CUDA error|CUDA driver|cudaError|no kernel image|invalid device function|"
    r"No HIP GPUs|no CUDA GPUs|Found no NVIDIA driver|MIOpen|miopenStatus|CUDNN_STATUS|HSA_STATUS|"
    r"Torch not compiled with CUDA|CUDA out of memory|HIP out of memory",
    re.I,
)
_OFFLINE = re.compile(
    r"Download failure|offline|Temporary failure in name resolution|Name or service not known|"
    r"Failed to establish a new connection|Max retries exceeded|Network is unreachable",
    re.I,
)
# Ultralytics' checks of what the user passed, by module (functions, or methods of its classes): an error
# raised inside one of these is the user's. compat checks that each is still defined where it says.
ULTRALYTICS_USER_CHECKS = {
    "ultralytics.data.utils": ("check_det_dataset", "check_cls_dataset"),
    "ultralytics.utils.checks": ("check_file", "check_yaml", "check_imgsz", "check_model_file_from_stem"),
    "ultralytics.cfg": ("check_cfg", "check_dict_alignment", "get_cfg", "cfg2dict", "smart_value"),
    "ultralytics.engine.trainer": ("check_resume",),
    "ultralytics.data.build": ("check_source",),
    # a --device torch cannot see (no GPU, not a ROCm build of torch, an id past the last GPU)
    "ultralytics.utils.torch_utils": ("select_device",),
    "ultralytics.nn.tasks": ("yaml_model_load", "guess_model_scale", "load_checkpoint", "torch_safe_load"),
    # YOLODataset: no labels, no valid images, boxes for a segment task
    "ultralytics.data.dataset": ("cache_labels", "get_labels", "verify_labels"),
    # BaseDataset: a split's folder or list that exists but names no image ("Error loading data from ...")
    "ultralytics.data.base": ("get_img_files",),
}
_USER_CHECK_NAMES = frozenset(name for names in ULTRALYTICS_USER_CHECKS.values() for name in names)


@dataclass(frozen=True)
class Classified:
    kind: str  # USER, ENVIRONMENT or INTERNAL_KIND
    line: str  # one line for the terminal: what went wrong (and where it helps, what to do)
    error: BaseException


def one_line(error: BaseException, *, typed: bool = True) -> str:
    """``"KeyError: 'x'"``: the exception's type and the first line of its message (``typed=False``: the line only)."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    if not typed:
        return first or type(error).__name__
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def chain(error: BaseException | None) -> list[BaseException]:
    """``error`` and its causes and contexts, outermost first."""
    out, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def _raised_in(error: BaseException) -> list[tuple[str, str]]:
    """(module file, function) of every frame of ``error``'s traceback, innermost last."""
    return [(frame.filename, frame.name) for frame in traceback.extract_tb(error.__traceback__)]


@functools.lru_cache(maxsize=1)
def _our_dirs() -> tuple[str, ...]:
    """The directories of rocm-yolo's own code: the package and ``patches/`` (installed as rocm_yolo.patches)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.find_spec("rocm_yolo.patches")
    patches = list(spec.submodule_search_locations or []) if spec else []
    return tuple(os.path.join(os.path.abspath(d), "") for d in (here, *patches))


def owner(filename: str) -> str | None:
    """Whose code a traceback frame's file is: ``"rocm_yolo"``, ``"ultralytics"`` or None (anyone else's)."""
    if os.path.abspath(filename).startswith(_our_dirs()):
        return "rocm_yolo"
    if f"{os.sep}ultralytics{os.sep}" in filename:
        return "ultralytics"
    return None


def raised_by_rocm_yolo(error: BaseException) -> bool:
    """Whether the innermost frame of ``error``'s traceback is rocm-yolo's own code."""
    frames = _raised_in(error)
    return bool(frames) and owner(frames[-1][0]) == "rocm_yolo"


def _from_ultralytics_check(error: BaseException) -> bool:
    """Raised inside one of Ultralytics' checks of the user's input (the innermost frame of either codebase)."""
    for filename, function in reversed(_raised_in(error)):
        found = owner(filename)
        if found is not None:
            return found == "ultralytics" and function in _USER_CHECK_NAMES
    return False


# Code that talks to the network: a connection error raised there is a download that failed. (A
# ConnectionError elsewhere, e.g. a BrokenPipeError when the reader of our output went away, is not.)
_NETWORK_CODE = re.compile(
    r"[/\\](urllib3?|http|requests|httpx|hub)[/\\]|[/\\]socket\.py$|[/\\]ssl\.py$|"
    r"ultralytics[/\\]utils[/\\]downloads\.py$"
)


def _from_network(error: BaseException) -> bool:
    return any(_NETWORK_CODE.search(filename) for filename, _ in _raised_in(error))


def _environment_reason(error: BaseException) -> str | None:
    if isinstance(error, SetupError):
        return str(error)
    if isinstance(error, ImportError) and not (error.name or "").startswith("rocm_yolo"):  # ours: a bug
        return f"a library failed to import ({one_line(error)}): reinstall it or fix its environment"
    if isinstance(error, OSError) and error.errno in _ENV_ERRNOS:
        where = f" ({error.filename})" if getattr(error, "filename", None) else ""
        advice = {
            errno.ENOSPC: "free space or choose another --project",
            errno.EDQUOT: "free space within your quota",
            errno.EROFS: "choose a writable --project",
            errno.EACCES: "check the permissions",
            errno.EPERM: "check the permissions",
        }.get(error.errno, "check the machine")
        return f"{os.strerror(error.errno).lower()}{where}: {advice}"
    if isinstance(error, MemoryError):
        return "out of host memory: use a smaller --batch or fewer --workers"
    if (isinstance(error, (ConnectionError, TimeoutError)) and _from_network(error)) or _OFFLINE.search(str(error)):
        return f"a download failed ({one_line(error)}): rocm-yolo runs offline only with local weights and data"
    if _GPU_RUNTIME.search(str(error)):
        return f"the GPU runtime failed ({one_line(error)}): run 'rocm-yolo doctor'"
    return None


def classify(error: BaseException) -> Classified:
    """User, environment or internal: the first positive identification along the cause chain wins."""
    links = chain(error)
    for link in links:
        if isinstance(link, UsageError):
            return Classified(USER, str(link), error)
    for link in links:
        reason = _environment_reason(link)
        if reason is not None:
            return Classified(ENVIRONMENT, reason, error)
    for link in reversed(links):  # the innermost Ultralytics check has the plainest message
        if _from_ultralytics_check(link):
            text = str(link).strip()
            return Classified(USER, text.splitlines()[0] if text else one_line(link), error)
    return Classified(INTERNAL_KIND, one_line(error), error)


def is_disk_error(error: BaseException) -> bool:
    """A full or read-only disk anywhere in the chain (the supervisor stops instead of restarting)."""
    return any(isinstance(e, OSError) and e.errno in DISK_ERRNOS for e in chain(error))


def save_traceback(error: BaseException, path: Path | None) -> Path | None:
    """Write ``error``'s traceback to ``path`` (or a file in the cache); the file written, or None."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    candidates = [path] if path is not None else []
    from rocm_yolo.run.paths import cache_dir

    candidates.append(cache_dir() / "errors" / f"internal-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    for candidate in candidates:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            candidate.write_text(text)
            return candidate
        except OSError:
            continue
    return None


def report_internal(error: BaseException, path: Path | None = None, prog: str = "rocm-yolo") -> int:
    """Say that a rocm-yolo bug happened, keep the traceback, point at it; the exit code."""
    saved = save_traceback(error, path)
    where = f"traceback in {saved}" if saved else "the traceback could not be saved"
    print(
        f"{prog}: internal error (a rocm-yolo bug, please report it): {one_line(error)}; {where}",
        file=sys.stderr,
        flush=True,
    )
    return INTERNAL
