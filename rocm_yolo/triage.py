"""Whose failure an exception is: the user's, the environment's, or rocm-yolo's (a bug).

:func:`classify` decides by what the exception is *and* where it was raised, not by its type
alone: a ``KeyError`` from a bug is internal, a ``FileNotFoundError`` from Ultralytics' data set
check is the user's (the checks are listed in :mod:`rocm_yolo.ultralytics_rules.user_checks`), a
GPU runtime's error (its words: :data:`rocm_yolo.diagnosis.vocabulary.GPU_RUNTIME`) or a full disk is the
environment's. The first positive identification along the
exception's cause chain wins. The CLI and the training child use it; it imports nothing heavy.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import traceback
from dataclasses import dataclass

from rocm_yolo.diagnosis import vocabulary
from rocm_yolo.errors import SetupError, UsageError, chain, one_line
from rocm_yolo.ultralytics_rules.user_checks import CHECK_NAMES

USER, ENVIRONMENT, INTERNAL_KIND = "user", "environment", "internal"


# Full or read-only disks and quotas: a restart cannot help, and the supervisor stops.
DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT}
_ENV_ERRNOS = DISK_ERRNOS | {errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE}

# Messages of downloads while offline (the GPU runtimes' are the diagnosis' vocabulary: vocabulary.GPU_RUNTIME).
_OFFLINE = re.compile(
    r"Download failure|offline|Temporary failure in name resolution|Name or service not known|"
    r"Failed to establish a new connection|Max retries exceeded|Network is unreachable",
    re.I,
)


@dataclass(frozen=True)
class Classified:
    kind: str  # USER, ENVIRONMENT or INTERNAL_KIND
    line: str  # one line for the terminal: what went wrong (and where it helps, what to do)
    error: BaseException


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
            return found == "ultralytics" and function in CHECK_NAMES
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
    if vocabulary.first(str(error), vocabulary.GPU_RUNTIME) is not None:
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
