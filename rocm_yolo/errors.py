"""Errors and exit codes, in one place.

The kinds of failure that reach a user, each as one line on the terminal and never as a
Python traceback:

- a **user error** (:class:`UsageError`): bad arguments, data or checkpoint, found by a
  check that knows what it is looking at. Exit 2; nothing started or changed.
- an **environment or setup error** (:class:`SetupError`): torch or the GPU runtime is
  broken, a library is missing, the disk is full or read-only, a download is needed while
  offline. Exit 4; never retried (a restart would meet it again); the traceback goes to
  ``RUN/setup-K.txt`` where a run directory exists.
- a failure the watchdog will not retry (:mod:`rocm_yolo.diagnosis.remedies`): a GPU fault or
  hang that came back, GPU out of memory (exit 4, the environment's), or the same failure twice
  at the same place (exit 5): a restart, or a scheduler's requeue, would meet it again.
- an **internal error**: anything else is a rocm-yolo bug. Exit 123 (as black's), the
  traceback kept in the run directory (``RUN/internal-K.txt``) or the cache, and the line
  says where.

:mod:`rocm_yolo.triage` tells them apart for an exception raised by Ultralytics or torch.
This module is imported by every process and imports nothing of rocm-yolo's but
:mod:`rocm_yolo.environment`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import traceback
from contextvars import ContextVar
from pathlib import Path

# --------------------------------------------------------------------------- exit codes

OK = 0  # training done
FAILED = 1  # failed after the allowed restarts, or a training error
USAGE = 2  # bad arguments, data or checkpoint: nothing was started or changed
SETUP = 4  # the environment is broken (torch, GPU runtime, disk full or read-only, offline): not retried
SAME_FAILURE = 5  # the same failure twice at the same place: a restart (or a requeue) cannot help
INTERNAL = 123  # a rocm-yolo bug: the traceback is kept and the line says where
HANGUP = 129  # SIGHUP: the terminal went away
PIPE_CLOSED = 141  # the reader of the output went away (as a command killed by SIGPIPE exits)
INTERRUPTED = 130  # Ctrl-C (SIGINT)
TERMINATED = 143  # SIGTERM

# Between the supervisor and its child only:
CHILD_FINISHED = 3  # the checkpoint to resume belongs to a run that has already finished
NODES_MISSING = 6  # more than one machine: a node did not come to the rendezvous in time; the run ends (1)
REGROUP = 7  # more than one machine: a node waits in a later round; this node's ranks stopped to meet it there

HELP = (
    "exit codes: 0 done; 1 failed after the allowed restarts; 2 usage error (nothing started); "
    "4 environment error (not retried), a GPU fault, GPU hang or hung collective that came back after its one retry, "
    "GPU out of memory, host out of memory twice at the same place; 5 the same failure twice at the same place; "
    "123 internal error (a rocm-yolo bug); 129/130/143 stopped by SIGHUP/Ctrl-C/SIGTERM; 141 the reader of the "
    "output went away"
)

REPORT_MODE = 0o640  # a report of a failure: the user's group may read it, no one else

# --------------------------------------------------------------------------- the user's own words

# Whether the user called rocm_yolo.train (messages and advice in Python: ``model=``, ``rocm_yolo.train(resume=...)``)
# or rocm-yolo (the command line: ``--model``, ``rocm-yolo train --resume ...``): set by rocm_yolo.api.train.
FROM_PYTHON: ContextVar[bool] = ContextVar("rocm_yolo_from_python", default=False)
_UNSET = object()
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(?:[,:.][A-Z0-9_]+)*(?:,\.\.\.)?")  # N, LAST_PT, HOST:PORT, P1,P2,...


def option(name: str, value: object = _UNSET) -> str:
    """An option of ``rocm-yolo train`` named as the user gives it: ``--device 0,1`` on the command line,
    ``device='0,1'`` from Python; ``data``: DATA, or ``data=``; ``watchdog``: ``--no-watchdog``, or
    ``watchdog=False``. Without ``value``, the option alone (``--resume``, ``resume=``)."""
    if FROM_PYTHON.get():
        if name == "watchdog" and value is _UNSET:
            return "watchdog=False"
        return f"{name}=" if value is _UNSET else f"{name}={python_value(value)}"
    if name == "data":
        return "DATA" if value is _UNSET else shell_word(value)
    flag = "--no-watchdog" if name == "watchdog" else "--" + name.replace("_", "-")
    return flag if value is _UNSET else f"{flag} {shell_word(value)}"


def shell_word(value: object) -> str:
    """``value`` as one word a shell reads back as it is (``shlex.quote``): a run named ``$(...)`` in an advice line
    the user copies runs nothing; a placeholder (``N``, ``LAST_PT``, ``HOST:PORT``) as it is."""
    text = str(value)
    return text if _PLACEHOLDER.fullmatch(text) else shlex.quote(text)


def python_value(value: object) -> str:
    """``value`` as a keyword's value in Python: ``'runs/detect/train'``, ``8``, ``True``; a placeholder (``N``,
    ``LAST_PT``) as it is."""
    if isinstance(value, str) and _PLACEHOLDER.fullmatch(value):
        return value
    return repr(str(value)) if isinstance(value, os.PathLike) else repr(value)


def command(data: object = None, **options: object) -> str:
    """A call of ``rocm-yolo train`` as the user would type it: ``rocm-yolo train --resume RUN --epochs N`` on the
    command line, ``rocm_yolo.train(resume='RUN', epochs=N)`` from Python. ``options``: rocm-yolo's own options
    (flags on the command line) and, after ``keys=``, Ultralytics arguments (KEY=VALUE on the command line)."""
    keys = options.pop("keys", None) or {}
    if FROM_PYTHON.get():
        args = ([python_value(data)] if data is not None else []) + [
            f"{k}={python_value(v)}" for k, v in {**options, **keys}.items()
        ]
        return f"rocm_yolo.train({', '.join(args)})"
    args = ([shell_word(data)] if data is not None else []) + [option(k, v) for k, v in options.items()]
    return " ".join(["rocm-yolo train", *args, *(shell_word(f"{k}={v}") for k, v in keys.items())])


# --------------------------------------------------------------------------- error classes


class UsageError(ValueError):
    """A user error: a bad flag, KEY=VALUE, path, data set, checkpoint or profile. One line, exit 2."""

    exit_code = USAGE


class SetupError(RuntimeError):
    """The environment keeps training from starting (or going on). One line, exit 4, never retried."""

    exit_code = SETUP


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


def save_traceback(error: BaseException, path: Path | None) -> Path | None:
    """Write ``error``'s traceback to ``path`` (or a file in the cache, if the cache is the user's own); the file
    written (0640, never through a link), or None."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    candidates = [path] if path is not None else []
    from rocm_yolo.environment import cache_dir, cache_problem

    fallback = cache_dir() / "errors" / f"internal-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    candidates += [fallback] if cache_problem(fallback) is None else []
    for candidate in candidates:
        try:
            candidate.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, REPORT_MODE)
            with os.fdopen(fd, "w") as f:
                os.fchmod(fd, REPORT_MODE)
                f.write(text)
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
