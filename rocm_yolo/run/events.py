"""The run log and its events: one line to the terminal, the same line with a time stamp in ``rocm-yolo.log``,
and, for events, a JSON line in ``rocm_yolo/events.jsonl`` that tests and ``status`` read."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PREFIX = "rocm-yolo:"


def foreign(text: str) -> str:
    """``text`` (a child's stderr) without rocm-yolo's own lines: what rocm-yolo said (its run header, a handled
    error it names) is never evidence of what failed the child."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.lstrip("\r").startswith(PREFIX))


class RunLog:
    def __init__(
        self,
        log_path: str | os.PathLike | None = None,
        events_path: str | os.PathLike | None = None,
        stream=None,
        rank: int | None = None,
    ):
        self.log_path = Path(log_path) if log_path else None
        self.events_path = Path(events_path) if events_path else None
        self.stream = stream
        self.rank = rank  # a DDP rank: its lines say which (rank 0 speaks for the run), its events carry it

    def _append(self, path: Path | None, text: str) -> None:
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError:
            pass

    def info(self, message: str) -> None:
        if self.rank:
            message = f"rank {self.rank}: {message}"
        stream = self.stream or sys.stderr
        try:  # one write: with PYTHONUNBUFFERED, print() writes the line and its newline apart
            stream.write(f"{PREFIX} {message}\n")
            stream.flush()
        except (OSError, ValueError):
            pass
        self.record(message)

    def record(self, line: str) -> None:
        """``line`` into the log file only, time-stamped (e.g. the output a lost terminal no longer shows)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._append(self.log_path, f"{stamp} [{os.getpid()}] {line}\n")

    def event(self, kind: str, message: str | None = None, /, **fields) -> None:
        """Record an event; ``message`` (if any) also goes to the terminal and the log (a ``message`` field, if
        given, goes into the record only)."""
        if message:
            self.info(message)
        record = {"event": kind, "time": time.time(), "pid": os.getpid(), **fields}
        if self.rank is not None:
            record["rank"] = self.rank
        self._append(self.events_path, json.dumps(record, default=str) + "\n")


def read_events(path: str | os.PathLike) -> list[dict]:
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
