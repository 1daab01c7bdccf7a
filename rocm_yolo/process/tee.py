"""A child's standard error, shown where the user reads rocm-yolo as it comes, and kept: in a bounded file, and its
tail in memory.

The watchdog reads what a training child wrote to stderr when it fails: the GPU runtime writes its last words there
from C (the HSA runtime's ``Memory access fault by GPU node-1 ... Reason: ...`` right before ``abort()``), and no
Python code of the child can catch them. So the child's stderr is a pipe whose other end this process holds: a
daemon thread reads every chunk at once and hands it to a sink (whole lines: a line's beginning waits up
to 0.1 s for its end, so the child's stdout, written to the same terminal, never lands inside it),
appends it to a file (kept under ``cap`` bytes: its newest half survives) and keeps the newest
``tail`` bytes in memory. The sink is :func:`rocm_yolo.process.output.stderr_sink`'s: the terminal (an
:class:`~rocm_yolo.process.output.FdSink`, which never blocks: a terminal whose output is paused with Ctrl-S keeps
neither this thread nor the child waiting, and gets what it missed, bounded, when it takes output again) or, in a
Jupyter kernel, the cell's stream. Whatever the child wrote before it died is
still in the pipe: :meth:`Tee.drain` waits (bounded) until it has been copied, so the lines keep their order with
this process's own. The thread ends when every writer of the pipe is gone.

The thread holds no locks but its own and its sink's while this process starts other processes: their
``preexec_fn`` (:func:`rocm_yolo.process.lifecycle.pdeathsig_kill`, one ``prctl`` through a library loaded before)
needs none, and glibc's ``fork`` resets its allocator's locks in the child.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import termios
import threading
import time
from collections import deque
from pathlib import Path

from rocm_yolo.process.output import FdSink, printable
from rocm_yolo.run.atomic import open_append, write_atomic

CAP = 1 << 20  # the file: at most 1 MiB (its newest half survives a trim)
TAIL = 64 << 10  # in memory: the newest 64 KiB
HOLD = 0.1  # seconds a line's beginning waits for its end before it is shown as it is
PARTIAL = 64 << 10  # a line's beginning held for its end: at most 64 KiB, then shown as it is


class Tee:
    def __init__(self, fd: int, out, path: Path | None = None, cap: int = CAP, tail: int = TAIL):
        """``out``: where the copy goes: a sink (:func:`rocm_yolo.process.output.stderr_sink`), a file descriptor (an
        :class:`~rocm_yolo.process.output.FdSink` of the Tee's own, closed when the pipe is), or None (no copy)."""
        self.fd = fd
        self._own = isinstance(out, int)
        self.out = FdSink(out) if self._own else out
        self.path = path
        self.cap = cap
        self.keep = tail
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._size = 0
        self._read = self._kept = 0  # bytes read from the pipe, and of them kept (drain waits for both)
        self.done = threading.Event()
        self._partial = b""  # a line's beginning not shown yet: shown whole, so another writer never cuts it
        self._reads: deque[tuple[float, int]] = deque(maxlen=4096)  # (wall clock, bytes kept): when each chunk came
        self._thread = threading.Thread(target=self._run, name="rocm-yolo-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    if self._partial and not select.select([self.fd], [], [], HOLD)[0]:
                        self._show(self._partial)  # nothing more came: show what there is
                        self._partial = b""
                        continue
                    data = os.read(self.fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                self._read += len(data)
                cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                shown, self._partial = (self._partial + data[:cut], data[cut:]) if cut else (b"", self._partial + data)
                if len(self._partial) > PARTIAL:  # a line that never ends is shown in pieces, not held whole
                    shown, self._partial = shown + self._partial, b""
                if shown:
                    self._show(shown)  # outside the lock; the sink never blocks on a paused terminal (Ctrl-S)
                with self._lock:
                    self._keep(data)
                    self._reads.append((time.time(), self._kept))
        finally:
            if self._partial:
                self._show(self._partial)
                self._partial = b""
            try:
                os.close(self.fd)
            except OSError:
                pass
            if self._own:
                self.out.close()
            self.done.set()

    def _show(self, data: bytes) -> None:
        if self.out is not None:
            self.out.write(printable(data))  # no control sequence of the child's reaches the terminal

    def _keep(self, data: bytes) -> None:
        self._kept += len(data)
        self._tail += data
        del self._tail[: max(0, len(self._tail) - self.keep)]
        if self.path is not None:
            self._append(data)

    def _append(self, data: bytes) -> None:
        try:
            if self._size + len(data) > self.cap:
                old = self.path.read_bytes() if self.path.exists() else b""
                kept = (old + data)[-(self.cap // 2) :]
                write_atomic(self.path, b"[... earlier output dropped ...]\n" + kept[kept.find(b"\n") + 1 :])
                self._size = self.path.stat().st_size
                return
            with open_append(self.path, text=False) as f:  # never through a link
                f.write(data)
            self._size += len(data)
        except OSError:
            self.path = None  # a full or read-only disk: the terminal and the tail still get it

    def pending(self) -> int:
        """Bytes written into the pipe and not yet copied (0 once the pipe is closed)."""
        if self.done.is_set():
            return 0
        buf = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return 0
        return buf[0]

    def drain(self, timeout: float = 2.0) -> None:
        """Wait until what the child wrote so far has been copied (at most ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        settled = 0
        while settled < 2 and time.monotonic() < deadline:  # twice in a row: a chunk just read is counted
            settled = settled + 1 if not self.pending() and self._kept == self._read and not self._partial else 0
            time.sleep(0.01)

    def mark(self, at: float | None = None) -> int:
        """Where the copy stood at wall-clock time ``at`` (now if None): the bytes kept by then, which :meth:`tail`
        splits at. A chunk copied after ``at`` may hold bytes written a moment before it: they count as after."""
        with self._lock:
            if at is None:
                return self._kept
            before = [kept for when, kept in self._reads if when <= at]
            return before[-1] if before else (self._kept - len(self._tail) if self._reads else 0)

    def tail(self, since: int | None = None) -> tuple[str, str]:
        """The newest ``tail`` bytes, split at the :meth:`mark` ``since``: (what came before it, what came after);
        all of it after when ``since`` is None."""
        with self._lock:
            start = self._kept - len(self._tail)  # the tail's first byte, counted from the pipe's first
            cut = min(max((since or 0) - start, 0), len(self._tail)) if since is not None else 0
            before, after = bytes(self._tail[:cut]), bytes(self._tail[cut:])
        return before.decode("utf-8", "replace"), after.decode("utf-8", "replace")
