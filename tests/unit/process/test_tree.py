"""Process trees: helpers die with their parent, a bounded run leaves nothing behind."""

from __future__ import annotations

import os
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


def test_after_the_reap_a_process_that_gets_the_childs_pid_is_never_signalled():
    """A real reused pid (issue 45): the child's session leaves an orphan, the child exits, the kill sweeps the
    orphan and reaps the child; then an unrelated tree of the same user is started as that very pid, in a session
    whose id is that number too. Nothing of the finished tree's handle reaches it: not a second kill, not a stop,
    not a SIGKILL, not the child's own signal; and what it lists is only what it saw before the reap."""
    import signal

    from helpers import start_with_pid

    child = tree.start(["sh", "-c", "sleep 300 & echo $!; exit 0"], stdout=subprocess.PIPE, text=True)
    held = tree.Tree(child)
    orphan = int(child.stdout.readline())
    assert held.wait(30) == 0 and held.exited() == 0 and not held.reaped  # exited, the number still its own
    assert {orphan, child.pid} <= {p.pid for p in held.members()}
    assert tree.kill(held, term_timeout=4, kill_timeout=4) == [] and held.reaped and not alive(orphan)
    deadline = time.monotonic() + 60  # the kernel frees the number once init has reaped the orphan (its sid)
    while psutil.pid_exists(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    stranger = start_with_pid(child.pid, ["sleep", "300"])
    try:
        assert os.getsid(stranger.pid) == child.pid  # its session has the old number too: the old sweep's target
        assert stranger.pid in {p.pid for p in tree.members(child.pid)}  # looked up again, the number names it
        assert held.members() == []  # only what was seen before the reap, and none of it runs
        tree.kill(held, term_timeout=1, kill_timeout=1)
        tree.kill_now(held, timeout=1)
        held.signal_child(signal.SIGKILL)
        tree.send(held.members(), signal.SIGSTOP)
        assert stranger.poll() is None and psutil.Process(stranger.pid).status() != psutil.STATUS_STOPPED
    finally:
        stranger.kill()
        stranger.wait()


def test_a_child_is_signalled_through_its_pidfd_and_its_exit_seen_without_reaping_it():
    child = tree.start(["sleep", "300"])
    held = tree.Tree(child)
    assert held.pidfd is not None and held.wait(0.2) is None
    held.signal_child(15)
    assert held.wait(30) == -15 and psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # not reaped
    assert held.reap() == -15 and held.reaped and held.pidfd is None


def test_no_interpreter_rocm_yolo_starts_imports_from_the_working_directory(tmp_path, monkeypatch):
    """A psutil.py left where the user trains from (a shared data set, /tmp) runs in nothing rocm-yolo starts: every
    command line is -P (issue 45); PYTHONPATH still counts. The probes' command lines are checked where they are
    built: the doctor's, the GPU count's, the conv self-test's."""
    from rocm_yolo.conv import selftest
    from rocm_yolo.doctor import system
    from rocm_yolo.doctor.options import Options
    from rocm_yolo.gpu import count

    marker = tmp_path / "ran"
    (tmp_path / "psutil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")  # the working directory's
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "mine.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "extra"))
    out = tree.run_bounded(tree.python("-c", "import psutil, mine; print(psutil.__file__, mine.VALUE)"), 60)
    assert out.returncode == 0 and not marker.exists() and out.stdout.split() == [psutil.__file__, "42"], out.stderr
    seen = []

    def bounded(cmd, *args, **kwargs):
        seen.append(list(cmd))
        return tree.Outcome(1, "", "", 0.0)

    for module in (system, count, selftest):
        monkeypatch.setattr(module, "run_bounded", bounded)
    system.python_json(Options(), "print(1)", 5)
    count.probe(5)
    selftest._run_child("cpu", ["native"], False, selftest.default_timing("cpu"), 5, None)
    assert len(seen) == 3 and all(cmd[:2] == [sys.executable, "-P"] for cmd in seen), seen
