"""The events of a run: what every process of it records in ``rocm_yolo/events.jsonl`` (one JSON object a line:
``event``, ``time``, ``pid``, a rank's ``rank``, and the event's own fields), read back by the supervisor, ``status``
and the tests (:func:`read_events`: its rotated older part first, :func:`rocm_yolo.run.atomic.append_log`), and
rocm-yolo's own lines in a child's stderr (:data:`PREFIX`, :func:`foreign`: never evidence of what failed it).

The writer, :class:`rocm_yolo.process.output.RunLog`, also shows each line where the user reads rocm-yolo.
:data:`FROM_PYTHON` says whether the user speaks Python (``rocm_yolo.train``) or the command line, so that advice
comes in their language.
"""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from pathlib import Path

from rocm_yolo import errors
from rocm_yolo.run.atomic import rotated

PREFIX = "rocm-yolo:"


def foreign(text: str) -> str:
    """``text`` (a child's stderr) without rocm-yolo's own lines: what rocm-yolo said (its run header, a handled
    error it names) is never evidence of what failed the child."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.lstrip("\r").startswith(PREFIX))


# Whether the user called rocm_yolo.train (advice in Python, e.g. rocm_yolo.supervisor.restart.resume_command) or
# rocm-yolo (advice on the command line): set by rocm_yolo.api.train for its call (kept in rocm_yolo.errors, whose
# messages speak the same language).
FROM_PYTHON: ContextVar[bool] = errors.FROM_PYTHON


def read_events(path: str | os.PathLike) -> list[dict]:
    """The events of ``path``, oldest first: those of its rotated older part (``events.jsonl.1``) too."""
    out = []
    lines = []
    for part in (rotated(path), Path(path)):
        try:
            lines += part.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
