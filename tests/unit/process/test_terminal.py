"""A terminal that goes away, for real: a pseudo-terminal whose master is closed makes every write to it fail with EIO.

The guarded stream writes through until then; the first write after the loss is not an error, the descriptor now
leads to /dev/null, ``on_lost`` hears it once, and each complete line (a progress bar's last state, colours
stripped) is kept.
"""

from __future__ import annotations

import errno
import io
import os

import pytest

from rocm_yolo.process import terminal


@pytest.fixture
def tty():
    master, slave = os.openpty()
    stream = io.TextIOWrapper(io.FileIO(slave, "w"), line_buffering=True)
    yield master, stream
    stream.close()
    try:
        os.close(master)
    except OSError:
        pass


def test_writes_survive_the_terminal_going_away_and_complete_lines_are_kept(tty):
    master, stream = tty
    kept, lost = [], []
    guarded = terminal.GuardedStream(stream, keep=kept.append, on_lost=lost.append)
    guarded.write("before\n")
    assert os.read(master, 100).replace(b"\r", b"") == b"before\n" and not guarded.lost
    os.close(master)  # the terminal window is closed
    with pytest.raises(OSError) as plain:
        os.write(stream.fileno(), b"x")  # what every write to it gets now
    assert plain.value.errno in terminal.LOST
    guarded.write("\r\x1b[1mepoch 1/3\x1b[0m  10%")  # a progress bar, redrawn
    guarded.write("\repoch 1/3  100%\n")
    guarded.write("a line\nhalf")
    guarded.flush()
    assert guarded.lost and len(lost) == 1 and lost[0].errno == errno.EIO
    assert kept == ["epoch 1/3  100%", "a line"]  # "half" waits for its end of line
    os.write(stream.fileno(), b"C code writes too")  # the descriptor leads to /dev/null now: no error
    assert guarded.fileno() == stream.fileno() and not guarded.isatty()  # everything else is the stream's


def test_other_errors_are_the_callers_and_guarding_twice_is_guarding_once(monkeypatch):
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    guarded = terminal.GuardedStream(Full())
    with pytest.raises(OSError):
        guarded.write("x")
    assert not guarded.lost
    monkeypatch.setattr("sys.stdout", io.StringIO())
    first = terminal.guard("stdout")
    assert terminal.guard("stdout") is first


def test_what_the_trainer_prints_keeps_its_colours_and_loses_every_other_control_sequence(tty):
    """Ultralytics prints class names and file names of the user's data set; one named with an escape sequence must
    show as text, never act on the terminal (issue 45). Colours and the progress bar's redraw stay."""
    master, stream = tty
    guarded = terminal.GuardedStream(stream)
    text = "\r\x1b[K\x1b[1mbold\x1b[0m \x1b]0;title\x07\x1b[2J\x9bdone\n"
    assert guarded.write(text) == len(text)  # all of it taken, as the stream it stands for would say
    assert os.read(master, 4096) == b"\r\x1b[K\x1b[1mbold\x1b[0m ]0;title[2Jdone\r\n"


def test_the_foreground_job_is_read_from_the_controlling_terminal():
    """A process in a session of its own on a pseudo-terminal it controls is its foreground job; with no terminal
    (a pipe), no answer."""
    import subprocess
    import sys

    master, slave = os.openpty()
    code = (
        "import fcntl, os, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
        "from rocm_yolo.process.terminal import in_foreground; print(in_foreground((0,)), in_foreground((3,)))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], stdin=slave, capture_output=True, text=True, timeout=60, start_new_session=True
    )
    os.close(slave)
    os.close(master)
    assert r.stdout.split() == ["True", "None"], r.stderr
