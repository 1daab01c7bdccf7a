"""Notify commands in the background (bounded, their failures said once, none left) and a child's stderr kept
(and shown, also on a paused terminal)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import termios
import time
import tty

import psutil

from rocm_yolo.process.background import BackgroundCommands
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.process.tee import Tee


def test_commands_get_their_input_and_a_failure_is_said_once(tmp_path):
    said = []
    commands = BackgroundCommands(timeout=30, on_failure=said.append)
    out = tmp_path / "got"
    commands.start(f"cat >> {out}", b'{"event": "started"}\n')
    commands.start("echo nope >&2; exit 3", b"{}\n")
    commands.start("no-such-command-here", b"{}\n")
    commands.close(grace=10)
    assert out.read_text() == '{"event": "started"}\n'
    assert said == ["exit 3: nope"] and commands.failures == 2 and commands.running == []


def test_a_command_that_never_returns_is_killed_with_what_it_started(tmp_path):
    said = []
    commands = BackgroundCommands(timeout=0.5, on_failure=said.append)
    marker = tmp_path / "pid"
    commands.start(f"sleep 300 & echo $! > {marker}; wait", b"{}\n")
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sleeper = int(marker.read_text())
    time.sleep(0.6)
    commands.poll()  # past its timeout: killed, its sleep too
    assert commands.running == [] and said == ["no answer within 0.5 s: killed"]
    assert not alive(sleeper)
    slow = BackgroundCommands(timeout=60, on_failure=said.append)
    slow.start("exec sleep 300", b"{}\n")
    pid = slow.running[0].proc.pid
    slow.close(grace=0.2)  # the run ended: it had its few seconds
    assert not psutil.pid_exists(pid) or not alive(pid)


def test_the_childs_stderr_is_copied_as_it_comes_kept_in_a_bounded_file_and_its_tail_in_memory(tmp_path):
    read_end, write_end = os.pipe()
    out_r, out_w = os.pipe()
    kept = tmp_path / "child.stderr"
    tee = Tee(read_end, out_w, kept, cap=4096, tail=100)
    code = "import os, sys; [os.write(2, b'x' * 99 + b'\\n') for _ in range(60)]; os.write(2, b'last words\\n')"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=write_end)
    os.close(write_end)
    proc.wait(timeout=60)
    tee.drain()
    earlier, after = tee.tail()
    assert earlier == "" and after.endswith("last words\n") and len(after) <= 100
    tee.done.wait(10)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        copied = f.read()
    assert copied.count(b"\n") == 61 and copied.endswith(b"last words\n")  # the terminal got all of it
    text = kept.read_text()
    assert len(text) <= 4096 and text.startswith("[... earlier output dropped ...]") and text.endswith("last words\n")


def test_commands_run_one_after_another_so_what_they_deliver_arrives_in_order(tmp_path):
    out = tmp_path / "got"
    commands = BackgroundCommands(timeout=30, on_failure=print)
    commands.start(f"sleep 0.3; cat >> {out}", b"first\n")  # slower than the next: it still comes first
    commands.start(f"cat >> {out}", b"second\n")
    assert len(commands.running) == 1 and len(commands.waiting) == 1  # the second waits: start never blocks
    commands.close(grace=10)
    assert out.read_text() == "first\nsecond\n"


def test_the_childs_stderr_reaches_the_terminal_in_whole_lines(tmp_path):
    """A line written in pieces (with PYTHONUNBUFFERED, print() writes a line and its newline apart) is shown whole,
    so what another process writes to the same terminal (the child's stdout) never lands inside it; a line's
    beginning with no end is shown after a moment."""
    read_end, write_end = os.pipe()
    out_r, out_w = os.pipe()
    tee = Tee(read_end, out_w, None)
    os.write(write_end, b"rocm-yolo: train loader: workers=0")
    time.sleep(0.03)
    os.write(write_end, b" timeout=0")
    os.write(write_end, b"\nnext line\nno end yet")
    shown = os.read(out_r, 4096)
    assert shown.startswith(b"rocm-yolo: train loader: workers=0 timeout=0\n")  # the first line whole, at once
    while not shown.endswith(b"no end yet"):
        shown += os.read(out_r, 4096)
    assert shown == b"rocm-yolo: train loader: workers=0 timeout=0\nnext line\nno end yet"
    os.close(write_end)
    tee.done.wait(10)
    os.close(out_w)
    os.close(out_r)


def test_the_tail_splits_at_a_mark_what_came_before_from_what_came_after():
    read_end, write_end = os.pipe()
    tee = Tee(read_end, None, None, tail=80)
    before_all = time.time()
    time.sleep(0.01)
    os.write(write_end, b"handled: HIP error: invalid device function\n")
    tee.drain()
    progress = time.time()  # the child's heartbeat, written after the line above
    time.sleep(0.01)
    os.write(write_end, b"the failure's own words\n")
    tee.drain()
    mark = tee.mark(progress)  # the mark is where the copy stood when the heartbeat was written, not when it is read
    assert tee.tail(mark) == ("handled: HIP error: invalid device function\n", "the failure's own words\n")
    assert tee.tail(tee.mark(before_all))[0] == ""  # a progress before any line: all of it is the failure's
    os.write(write_end, b"y" * 100 + b"\n")  # the tail keeps 80 bytes: the mark is older than all of them
    tee.drain()
    earlier, after = tee.tail(mark)
    assert earlier == "" and after == "y" * 79 + "\n"
    os.close(write_end)
    tee.done.wait(10)


def test_a_paused_terminal_keeps_neither_the_tee_nor_the_child_waiting_and_gets_it_all_later(tmp_path):
    """Ctrl-S on the terminal (TCOOFF on a real pseudo-terminal): the child writes four times what its stderr pipe
    holds and exits, the Tee keeps all of it (file and tail); once the terminal takes output again (TCOON) it shows
    every byte, in order."""
    master, slave = os.openpty()
    tty.setraw(slave)  # no newline translation
    termios.tcflow(slave, termios.TCOOFF)
    read_end, write_end = os.pipe()
    kept = tmp_path / "child.stderr"
    tee = Tee(read_end, slave, kept)
    code = "import os; [os.write(2, b'%05d ' % i + b'y' * 250 + b'\\n') for i in range(1000)]"  # 256 KB
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=write_end)
    os.close(write_end)
    assert proc.wait(timeout=60) == 0  # never blocked on its pipe
    assert tee.done.wait(10)  # the pipe copied to its end
    expected = b"".join(b"%05d " % i + b"y" * 250 + b"\n" for i in range(1000))
    assert kept.read_bytes() == expected and tee.tail()[1].endswith("00999 " + "y" * 250 + "\n")
    assert not select.select([master], [], [], 0.2)[0]  # the paused terminal showed nothing yet
    termios.tcflow(slave, termios.TCOON)
    shown = b""
    while len(shown) < len(expected) and select.select([master], [], [], 10)[0]:
        shown += os.read(master, 65536)
    assert shown == expected
    os.close(slave)
    os.close(master)


def test_what_a_child_writes_reaches_the_terminal_without_control_sequences_and_a_line_that_never_ends_is_bounded():
    """Colours and Ultralytics' "\\r\\x1b[K" progress bars pass; a clipboard write (OSC 52), a terminal query whose
    answer the terminal would type as input (DSR), a bell, a C1 control, are gone; a partial line is held at most
    PARTIAL bytes (issue 45)."""
    from rocm_yolo.process import tee as tee_module

    read_end, write_end = os.pipe()
    out_r, out_w = os.pipe()
    tee = Tee(read_end, out_w, None)
    bar = b"\r\x1b[K  1/3  \x1b[34m\x1b[1mtrain:\x1b[0m 50%\n"
    os.write(write_end, bar + b"class \x1b]52;c;cm0gLXJmIH4=\x07evil\x1b[6n \xc2\x9b31m \xc3\xa9t\xc3\xa9\tok\n")
    shown = b""
    while shown.count(b"\n") < 2:
        shown += os.read(out_r, 4096)
    assert shown == bar + b"class ]52;c;cm0gLXJmIH4=evil[6n 31m \xc3\xa9t\xc3\xa9\tok\n"
    endless = b"x" * (tee_module.PARTIAL * 3)  # no newline, written faster than HOLD
    os.write(write_end, endless[: len(endless) // 2])
    os.write(write_end, endless[len(endless) // 2 :])
    got = b""
    while len(got) < len(endless):
        got += os.read(out_r, 1 << 16)
    assert got == endless and len(tee._partial) <= tee_module.PARTIAL
    os.close(write_end)
    tee.done.wait(10)
    os.close(out_w)
    os.close(out_r)
