"""The supervisor's handle on its training child signals only what it started (issue 45): once the child is reaped,
its pid is never a root again, even when an unrelated tree of the user's gets that very number (a real reuse)."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import psutil

from helpers import start_with_pid
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.supervisor import trainer_process
from rocm_yolo.supervisor.config import WatchdogConfig

CHILDREN = Path(__file__).parent / "children"


def test_after_the_kill_reaps_the_trainer_its_pid_is_never_signalled_again(spec, monkeypatch):
    monkeypatch.setattr(trainer_process, "TRAINER_MODULE", "orphan_then_exit")
    monkeypatch.setenv("PYTHONPATH", str(CHILDREN))
    child = trainer_process.TrainerProcess(spec, WatchdogConfig(term_timeout=2, kill_timeout=2))
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.poll() == 3 and psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # seen, not reaped
    _, said = child.stderr_tail()
    orphan = int(re.search(r"orphan (\d+)", said)[1])
    assert {child.pid, orphan} <= set(child.pids())  # the number is still its own: its session is found by it
    assert child.kill() == [] and not alive(orphan)
    while psutil.pid_exists(orphan) and time.monotonic() < deadline + 60:  # init reaps it: the number is free
        time.sleep(0.1)
    stranger = start_with_pid(child.pid, ["sleep", "300"])
    try:
        assert child.pids() == []
        child.pause()
        child.unpause()
        child.kill()
        assert child.blocked_on_terminal() is None
        assert stranger.poll() is None and psutil.Process(stranger.pid).status() != psutil.STATUS_STOPPED
    finally:
        stranger.send_signal(signal.SIGKILL)
        stranger.wait()
