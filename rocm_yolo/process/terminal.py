"""A terminal that went away is no failure: its writes are dropped or kept in the run's log, and training goes on.

``setsid rocm-yolo train ... &`` (or ``nohup``), then the terminal closed: every write to it fails with EIO (ENXIO
once the device is gone). Ultralytics' progress bar writes to ``sys.stdout`` on every update, so the first write
after the terminal went away raised into the training loop: a training crash, restarted three times down the
ladder (issue 27). :func:`guard` puts a :class:`GuardedStream` in place of ``sys.stdout`` (or ``sys.stderr``): the
same stream until a write fails because the terminal is gone; then the file descriptor is pointed at
``/dev/null`` (what C writes to it is dropped too), ``on_lost`` is called once, and from then on each complete
line (a progress bar's last state, without colours) goes to ``keep``, e.g. the run's log. A reader that went
away from a pipe (EPIPE) is not guarded: the CLI stops quietly on it (exit 141), as before. What it writes keeps no
control character a terminal would act on but colours (:func:`rocm_yolo.process.output.printable`).

Install it before the code that keeps a reference to the stream is imported (Ultralytics' logger holds
``sys.stdout`` from its import on). :func:`in_foreground` says whether the job is its terminal's foreground job (what
a stop for terminal output waits for).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Callable, Optional

from rocm_yolo.process.output import printable

LOST = frozenset({errno.EIO, errno.ENXIO})  # the terminal is gone
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PARTIAL_MAX = 4096  # of a line never ended (a bar that redraws with \r), the newest part is kept


class GuardedStream:
    """A text stream whose writes survive the loss of its terminal (everything else goes to the stream itself)."""

    def __init__(
        self,
        stream,
        keep: Optional[Callable[[str], None]] = None,
        on_lost: Optional[Callable[[OSError], None]] = None,
    ):
        self._stream = stream
        self._keep = keep
        self._on_lost = on_lost
        self.lost = False
        self._partial = ""

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                self._stream.write(printable(text))  # no control sequence but colours reaches the terminal
                return len(text)
            except OSError as e:
                if e.errno not in LOST:
                    raise
                self._lose(e)
        self._kept(text)
        return len(text)

    def flush(self) -> None:
        if self.lost:
            return
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in LOST:
                raise
            self._lose(e)

    def _lose(self, error: OSError) -> None:
        self.lost = True
        try:  # what is buffered, and what C code writes to the descriptor, goes nowhere from now on
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
            self._stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        if self._on_lost is not None:
            self._on_lost(error)

    def _kept(self, text: str) -> None:
        if self._keep is None:
            return
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            line = _ANSI.sub("", line.rsplit("\r", 1)[-1]).rstrip()
            if line:
                self._keep(line)
        cut = self._partial.rfind("\r")  # a bar redrawn: only its newest state counts
        self._partial = self._partial[cut:] if cut >= 0 else self._partial[-_PARTIAL_MAX:]

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def in_foreground(fds: tuple[int, ...] = (2, 1, 0)) -> bool | None:
    """Whether this process's group is its terminal's foreground group (a job after ``fg``), read from the first of
    ``fds`` that is its controlling terminal; None where none is (no terminal, or one it does not control)."""
    for fd in fds:
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return None


def guard(
    name: str = "stdout",
    keep: Optional[Callable[[str], None]] = None,
    on_lost: Optional[Callable[[OSError], None]] = None,
) -> GuardedStream:
    """Put a :class:`GuardedStream` in place of ``sys.<name>`` (once: a guarded stream stays as it is)."""
    current = getattr(sys, name)
    if isinstance(current, GuardedStream):
        return current
    guarded = GuardedStream(current, keep, on_lost)
    setattr(sys, name, guarded)
    return guarded
