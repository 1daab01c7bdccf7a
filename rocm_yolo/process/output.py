"""What a process of the run shows the user and keeps: the run log (:class:`RunLog`), one line where the user reads
rocm-yolo, the same line with a time stamp in ``rocm-yolo.log``, and, for events, a JSON line in
``rocm_yolo/events.jsonl`` (the record :mod:`rocm_yolo.run.events` reads back). Both files are appended to without
following a link, and rotate past about 10 MiB (:func:`rocm_yolo.run.atomic.append_log`).

Where a line is shown is where the user's ``sys.stderr`` goes (:func:`stderr_sink`). On the process's own fd 2 (a
terminal, a pipe, a file) that is an :class:`FdSink`, which never blocks its caller: a terminal whose output is
paused (Ctrl-S, ``tcflow(TCOOFF)``) takes nothing, so what it does not take is kept (the newest :data:`BOUND`
bytes, in whole lines) and a thread writes it once the terminal takes output again, with a line saying how much was
dropped, if any. Anywhere else, a Jupyter kernel's ``OutStream`` (whose ``fileno()`` is the kernel's saved copy of
its original stderr, not the cell) or any stand-in, it is the stream itself (:class:`StreamSink`). A training
child's stderr, copied by :class:`rocm_yolo.process.tee.Tee`, goes through the same sink, so the two keep their
order. What reaches the terminal keeps no control character it would act on but colours (:func:`printable`).
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import re
import select
import stat
import sys
import threading
import time
from pathlib import Path

from rocm_yolo.run.atomic import append_log
from rocm_yolo.run.events import PREFIX

# What reaches the terminal keeps newlines, tabs and carriage returns (progress bars redraw with \r), and of the
# escape sequences only colours (SGR, ESC [ ... m) and erase-in-line (ESC [ K: Ultralytics' bar draws "\r\x1b[K"):
# they change how the current line looks and nothing else. Every other control character goes, and with it every
# other sequence: a title or clipboard write (OSC 52), a query whose answer the terminal types as input (DSR, DA),
# a cursor moved to overwrite earlier lines, C1 controls (U+0080-U+009F). A file name or class name of a data set,
# printed by Ultralytics or a child, then shows as text, never acts on the terminal.
_CONTROLS = re.compile(rb"\x1b\[[0-9;]{0,32}[mK]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")
_CONTROLS_TEXT = re.compile(r"\x1b\[[0-9;]{0,32}[mK]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def printable(data: bytes | str) -> bytes | str:
    """``data`` without the control characters a terminal would act on (see above): colours and erase-in-line kept."""
    pattern, escape = (_CONTROLS, b"\x1b[") if isinstance(data, bytes) else (_CONTROLS_TEXT, "\x1b[")
    return pattern.sub(lambda m: m.group() if m.group().startswith(escape) else data[:0], data)


BOUND = 1 << 20  # what a terminal that takes no output is kept, at most: the newest 1 MiB
WAIT = 0.5  # seconds the writer thread waits for the terminal at a time
GONE = frozenset({errno.EIO, errno.ENXIO, errno.EPIPE, errno.EBADF})  # no one will read what is written there


class FdSink:
    """Bytes to a file descriptor, never blocking the caller (the supervisor's loop, the Tee's thread).

    A terminal or a pipe is written through a description of its own, opened anew with ``O_NONBLOCK`` (the one the
    descriptor shares with the shell and the training child must stay blocking: their writes would fail), and
    ``O_NOCTTY`` (a session leader must not make the terminal its own, or its hang-up would stop the run). What it
    does not take now is kept, the newest ``bound`` bytes in whole lines, and written by a thread when it takes
    output again (a note first, if any was dropped); until then later writes queue behind it, in order. The thread
    is no daemon: at exit the process shows what it kept, as any program's output. A regular file (or a
    descriptor that cannot be opened anew: no ``/proc``, a socket) is written as it is. A terminal that went away
    (EIO) or a reader gone (EPIPE) drops what comes, as a lost terminal does.
    """

    def __init__(self, fd: int, bound: int = BOUND):
        self.fd = fd
        self.bound = bound
        self.lost = False
        self.dropped = 0  # bytes dropped over the bound, all told
        self._drop = 0  # of them, not said yet
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._out, self._ident = -1, None
        self._open()

    def _open(self) -> None:
        """Point at what ``fd`` is now: its own non-blocking description where it needs one."""
        if self._out not in (-1, self.fd):
            _close(self._out)
        self._out, self._ident, self.lost = self.fd, None, False
        try:
            st = os.fstat(self.fd)
        except OSError:
            self.lost = True
            return
        self._ident = (st.st_dev, st.st_ino)
        if stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode):
            return  # a file always takes what is written
        try:
            self._out = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            self._out = self.fd

    def _follow(self) -> None:
        """``fd`` pointed elsewhere since (dup2: pytest's capture, ipykernel): follow it."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return
        if (st.st_dev, st.st_ino) != self._ident and not self._pending:
            self._open()

    @property
    def pending(self) -> int:
        """Bytes kept, not written yet."""
        with self._lock:
            return len(self._pending)

    def write(self, data: bytes) -> None:
        if not data:
            return
        with self._lock:
            self._follow()
            if self.lost:
                return
            if not self._pending:
                data = self._write_now(data)
                if not data or self.lost:
                    return
            self._keep(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_later, name="rocm-yolo-output", daemon=False)
                self._thread.start()

    def _write_now(self, data: bytes) -> bytes:
        """Write what the descriptor takes now (under the lock); the rest."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._out, view) :]
        except BlockingIOError:
            return bytes(view)
        except OSError as e:  # dropped; the terminal went away (EIO), the reader did (EPIPE): so is what comes
            if e.errno in GONE:
                self.lost = True
                self._pending.clear()
                self._idle.notify_all()
        return b""

    def _keep(self, data: bytes) -> None:
        self._pending += data
        over = len(self._pending) - self.bound
        if over > 0:  # the oldest go, in whole lines
            cut = self._pending.find(b"\n", over - 1) + 1 or len(self._pending)
            del self._pending[:cut]
            self.dropped += cut
            self._drop += cut

    def _write_later(self) -> None:
        poll = select.poll()
        poll.register(self._out, select.POLLOUT)
        while True:
            with self._lock:
                if self.lost or not self._pending:
                    self._thread = None
                    self._idle.notify_all()
                    if self._closing:
                        self._close_out()
                    return
            if not poll.poll(WAIT * 1000):
                continue
            with self._lock:
                if self._drop:
                    note = (
                        f"{PREFIX} {self._drop:,} bytes of output not shown: the terminal took none for a while "
                        "(the run's rocm-yolo.log and child-K.stderr keep them)\n"
                    )
                    self._pending[:0] = note.encode()
                    self._drop = 0
                rest = self._write_now(bytes(self._pending))
                del self._pending[: len(self._pending) - len(rest)]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout`` seconds) until everything kept is written or dropped; whether it is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending or self.lost, timeout)

    def close(self) -> None:
        """No more writes: the description of its own goes once what is kept is written."""
        with self._lock:
            self._closing = True
            if self._thread is None:
                self._close_out()

    def _close_out(self) -> None:
        if self._out not in (-1, self.fd):
            _close(self._out)
        self._out = -1
        self.lost = True


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class StreamSink:
    """Bytes or text to a Python text stream: a Jupyter kernel's ``OutStream`` (its cell), a test's stand-in."""

    def __init__(self, stream):
        self.stream = stream
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode  # a character cut between chunks
        self._lock = threading.Lock()

    def write(self, data: bytes | str) -> None:
        with self._lock:
            text = data if isinstance(data, str) else self._decode(data)
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or gone
                pass

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


_shared: dict[int, FdSink] = {}
_shared_lock = threading.Lock()


def _forget_shared() -> None:  # a forked child (a DataLoader worker) starts with none: a lock may be held
    global _shared_lock
    _shared.clear()
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_shared)


def stderr_sink(stream=None) -> FdSink | StreamSink:
    """Where the user reads what rocm-yolo shows: ``stream`` (default ``sys.stderr``) itself when it does not write to
    the process's fd 2 (a Jupyter kernel's OutStream, a stand-in), else fd 2 (one :class:`FdSink` per process, shared:
    its lines keep their order)."""
    target = sys.stderr if stream is None else stream
    try:
        fd = target.fileno() if target is not None else 2
    except (OSError, ValueError, AttributeError):
        fd = None
    if fd != 2:
        return StreamSink(target)
    with _shared_lock:
        if 2 not in _shared:
            _shared[2] = FdSink(2)
        return _shared[2]


def show(text: str, stream=None) -> None:
    """``text`` where the user reads rocm-yolo (:func:`stderr_sink`), without blocking on a paused terminal."""
    sink = stderr_sink(stream)
    text = printable(text)  # a path or a name of the user's data shows as text, never acts on the terminal
    sink.write(text if isinstance(sink, StreamSink) else text.encode("utf-8", "replace"))


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
            append_log(path, text)  # never through a link; rotates past about 10 MiB (NAME.1)
        except OSError:
            pass

    def info(self, message: str) -> None:
        if self.rank:
            message = f"rank {self.rank}: {message}"
        show(f"{PREFIX} {message}\n", self.stream)  # one write: never its line and its newline apart
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
