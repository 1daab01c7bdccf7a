"""Process trees: helpers die with their parent, a bounded run leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from helpers import descendants
from rocm_yolo.process import tree
from rocm_yolo.process.lifecycle import alive


def test_helper_children_die_with_their_parent(tmp_path):
    code = (
        "import sys, time; from rocm_yolo.process import tree; "
        "c = tree.start(['sleep', '120']); print(c.pid, flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.1)
    assert not alive(child)


def test_run_bounded_kills_the_whole_tree(tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
        "time.sleep(600)\n"
    )
    before = descendants()
    outcome = tree.run_bounded([sys.executable, "-c", code], timeout=3)
    assert outcome.timed_out and outcome.returncode is None
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert descendants() <= before


def test_every_process_of_a_big_tree_gets_its_py_spy_dump_within_one_budget(tmp_path):
    """py-spy reads the processes side by side: 8 dumps of 1.5 s each fit a 6 s budget (one after the other,
    the last four would find the budget used). The stand-in py-spy sleeps, then says which pid it read."""
    fake = tmp_path / "py-spy"
    fake.write_text('#!/bin/sh\nsleep 1.5\necho "read $4"\n')
    fake.chmod(0o755)
    pids = list(range(1000, 1008))
    dumps = tree._py_spy_all(str(fake), pids, budget=6.0)
    assert sorted(dumps) == pids
    assert all(f"read {pid}" in dumps[pid] for pid in pids), dumps
    assert tree._py_spy_all(None, pids, budget=6.0) == {}  # no py-spy: faulthandler's stacks only


def test_a_tree_that_waits_for_its_paused_terminal_is_told_apart_and_a_stopped_tree_is_killed_promptly():
    """Ctrl-S on a real pseudo-terminal: the writer blocks in write(2) on the terminal; Ctrl-Q lets it go. A tree
    stopped by SIGSTOP ends at once when killed (SIGTERM, then SIGCONT), not after the timeouts."""
    import os
    import pty
    import signal
    import termios

    master, slave = pty.openpty()
    os.set_blocking(master, False)
    writer = tree.start([sys.executable, "-c", "import os\nwhile True: os.write(1, b'x' * 4096)"], stdout=slave)
    held = tree.Tree(writer)
    try:
        termios.tcflow(slave, termios.TCOOFF)  # the terminal takes no more output: Ctrl-S
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and tree.blocked_on_terminal(tree.members(writer.pid)) is None:
            try:
                os.read(master, 1 << 16)  # what the terminal showed before the pause
            except BlockingIOError:
                pass
            time.sleep(0.1)
        assert tree.blocked_on_terminal(tree.members(writer.pid)) == writer.pid
        termios.tcflow(slave, termios.TCOON)  # Ctrl-Q
        for _ in range(50):
            try:
                os.read(master, 1 << 20)
            except BlockingIOError:
                pass
            if tree.blocked_on_terminal(tree.members(writer.pid)) is None:
                break
            time.sleep(0.05)
        os.kill(writer.pid, signal.SIGSTOP)
        began = time.monotonic()
        assert tree.kill(held, term_timeout=8, kill_timeout=4) == []
        assert time.monotonic() - began < 4  # woken to find the SIGTERM: not the 4 s of a leader's wait
    finally:
        writer.kill()
        writer.wait()
        os.close(master)
        os.close(slave)
    sleeper = tree.start(["sleep", "30"])
    assert tree.blocked_on_terminal(tree.members(sleeper.pid)) is None
    tree.kill_now(tree.Tree(sleeper))
