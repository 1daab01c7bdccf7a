"""Where rocm-yolo's lines are shown (issue 31): a paused terminal (a real pseudo-terminal, TCOOFF) never blocks a
writer and gets what it missed, bounded, when it takes output again; a stand-in ``sys.stderr`` (a Jupyter kernel's
OutStream, a test's) gets the lines itself."""

from __future__ import annotations

import io
import os
import select
import sys
import termios
import threading
import tty

import pytest

from rocm_yolo.process import output
from rocm_yolo.process.output import FdSink, RunLog, StreamSink, stderr_sink


@pytest.fixture
def terminal():
    """A pseudo-terminal in raw mode (no newline translation): (the side a terminal window reads, the process's)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    yield master, slave
    for fd in (master, slave):
        try:
            os.close(fd)
        except OSError:
            pass


def read_all(master: int, want: int) -> bytes:
    """What the terminal window shows, until ``want`` bytes came (or nothing more does for 5 s)."""
    got = b""
    while len(got) < want and select.select([master], [], [], 5)[0]:
        got += os.read(master, 65536)
    return got


def in_a_thread(work) -> None:
    """Run ``work`` in a thread that must end: a writer blocked on the terminal would not."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the writer blocked on the paused terminal"


def test_a_paused_terminal_blocks_no_writer_and_shows_everything_once_it_takes_output_again(terminal):
    master, slave = terminal
    termios.tcflow(slave, termios.TCOOFF)  # Ctrl-S
    sink = FdSink(slave)
    lines = [f"line {i:03d} {'x' * 80}\n".encode() for i in range(400)]  # 36 KB: more than a terminal buffers
    in_a_thread(lambda: [sink.write(line) for line in lines])
    assert not select.select([master], [], [], 0.3)[0]  # nothing shown while paused
    assert sink.pending == sum(map(len, lines)) and sink.dropped == 0
    termios.tcflow(slave, termios.TCOON)  # Ctrl-Q
    assert read_all(master, len(b"".join(lines))) == b"".join(lines)  # nothing lost below the bound, in order
    assert sink.flush(10) and sink.pending == 0
    sink.write(b"live again\n")  # written at once, as before
    assert read_all(master, 11) == b"live again\n"


def test_over_the_bound_the_oldest_lines_go_and_the_terminal_is_told_how_much(terminal):
    master, slave = terminal
    termios.tcflow(slave, termios.TCOOFF)
    sink = FdSink(slave, bound=1000)
    lines = [f"{i:02d}{'x' * 97}\n".encode() for i in range(30)]  # 100 bytes each
    in_a_thread(lambda: [sink.write(line) for line in lines])
    assert sink.pending == 1000 and sink.dropped == 2000  # the newest 10 lines, whole
    termios.tcflow(slave, termios.TCOON)
    shown = b""
    while shown.count(b"\n") < 11:  # the note, then the 10 lines kept
        shown += read_all(master, 1)
    note, rest = shown.decode().split("\n", 1)
    assert note.startswith("rocm-yolo: 2,000 bytes of output not shown: the terminal took none for a while")
    assert rest == b"".join(lines[20:]).decode()


def test_a_terminal_that_went_away_drops_what_comes_without_an_error(terminal):
    master, slave = terminal
    sink = FdSink(slave)
    os.close(master)  # the terminal window is closed: writes fail with EIO
    sink.write(b"nobody reads this\n")
    assert sink.lost and sink.pending == 0 and sink.flush(1)


def test_a_stand_in_for_stderr_gets_the_lines_itself(monkeypatch, tmp_path):
    """Not fd 2 (a Jupyter kernel's OutStream answers fileno() with its saved copy of the original stderr, a test's
    StringIO has none): the lines go to the stream, where the user reads them."""

    class OutStream(io.StringIO):  # as ipykernel's: fileno() is another descriptor than 2
        def fileno(self):
            return 44

    for stand_in in (io.StringIO(), OutStream()):
        monkeypatch.setattr(sys, "stderr", stand_in)
        assert isinstance(stderr_sink(), StreamSink)
        RunLog(tmp_path / "log").info("loaders: workers=2")
        output.show("rocm-yolo: done\n")
        assert stand_in.getvalue() == "rocm-yolo: loaders: workers=2\nrocm-yolo: done\n"


def test_the_processes_own_stderr_is_one_shared_sink():
    """On fd 2 every line (the supervisor's, the child's copy, the CLI's last) goes through one sink: one order."""
    fd2 = os.fdopen(2, "w", closefd=False)
    assert stderr_sink(fd2) is stderr_sink(fd2) and isinstance(stderr_sink(fd2), FdSink)


def test_bytes_cut_inside_a_character_reach_a_stream_whole():
    out = io.StringIO()
    sink = StreamSink(out)
    data = "é ok\n".encode()
    sink.write(data[:1])
    sink.write(data[1:])
    assert out.getvalue() == "é ok\n"
