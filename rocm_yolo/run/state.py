"""``supervisor.json``: the state of a run as its supervisor last wrote it.

The supervisor writes it (atomically) at every change of attempt, state or recovery;
``rocm-yolo status`` and a resumed run's supervisor read it. A reader gets ``None`` for a
file that is missing, unreadable or badly typed, never an exception.
"""

from __future__ import annotations

import json
import os

from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.paths import RunPaths

# The fields of supervisor.json and the types a reader accepts.
_TYPES = {
    "state": str,
    "supervisor_pid": int,
    "child_pid": (int, type(None)),
    "attempt": int,
    "profile": str,
    "restarts": int,
    "max_restarts": int,
    "hangs": list,
    "lost_seconds": (int, float),
    "started": (int, float),
    "updated": (int, float),
}


def write_state(run_dir: str | os.PathLike, record: dict) -> None:
    """Write ``record`` as the run's state; OSError when the disk refuses (the caller decides)."""
    paths = RunPaths(run_dir)
    paths.state.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.supervisor, json.dumps(record))


def read_state(run_dir: str | os.PathLike) -> dict | None:
    """``supervisor.json`` of ``run_dir``, or None if missing, unreadable or badly typed."""
    try:
        data = json.loads(RunPaths(run_dir).supervisor.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key, kind in _TYPES.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    if not all(isinstance(h, dict) for h in data["hangs"]):
        return None
    return data
