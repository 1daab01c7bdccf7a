"""Signals (issue 27), for real: a stop in the middle of an epoch's save, a hangup under nohup, Ctrl-Z, a terminal
that goes away.

Real trainings on the CPU (tiny data, imgsz 32), real signals to real processes, a real pseudo-terminal. The CLI
runs in a session of its own, as a shell's job does: what a terminal sends its job (SIGHUP when it goes away,
SIGTSTP for Ctrl-Z) goes to that process group, which holds the supervisor only (the training tree
runs in a session of its own).
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import threading
import time

import psutil
import torch

from helpers import TINY, epochs_in, events, wait_for
from rocm_yolo import errors
from rocm_yolo.run import heartbeat
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state

STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def training(run, proc, cli) -> None:
    """Wait until the run trains batches."""
    beat = RunPaths(run).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "batches_total", 0) > 0, 240, "training", proc, cli)


def test_a_stop_in_the_middle_of_an_epochs_save_leaves_last_pt_whole_and_resumable(cli, tiny_data, tmp_path):
    """SIGTERM to the supervisor while epoch 2's last.pt is half written (Ultralytics truncated it in place: 3 of 3
    tries left it empty): the save completes first, then the run stops (143); last.pt holds epoch 2, no temporary
    file is left, and the resume trains epoch 3 only."""
    run = tmp_path / "runs" / "detect" / "s"
    r = cli.run(
        "train",
        str(tiny_data),
        "--epochs",
        "3",
        "--workers",
        "0",
        "--name",
        "s",
        *TINY,
        env={"ROCM_YOLO_FAULT": "epoch-save-stop@2"},
        timeout=300,
    )
    paths = RunPaths(run)
    assert r.returncode == errors.TERMINATED, r.stdout[-3000:]
    assert (paths.state / "fault-epoch-save-stop.fired").exists()  # the stop did land in the middle of the save
    assert torch.load(paths.last, map_location="cpu", weights_only=False)["epoch"] == 1  # 0-based: epoch 2
    assert not list(paths.weights.glob(".*.tmp")) and cli.leftovers() == []
    assert f"resume with: rocm-yolo train --resume {paths.last}" in r.stdout
    status = cli.run("status", str(run), timeout=60).stdout  # where it was heard, and what a resume starts from
    assert "state:     interrupted" in status and "progress:  epoch 2/3" in status
    assert "resume:    from the start of epoch 3/3 (weights/last.pt)" in status
    [stopped] = events(run, "stopped")
    assert stopped["epoch"] == 2 and stopped["exit_code"] == errors.TERMINATED  # the stop says where the run was
    r = cli.run("train", "--resume", str(paths.last), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert epochs_in(run) == [1, 2, 3] and "done: epoch 3 in" in r.stdout


def test_under_nohup_a_hangup_does_not_stop_the_run(cli, tiny_data, tmp_path):
    """``nohup rocm-yolo train ...``: the terminal going away (SIGHUP to the job) leaves the run training to the
    end (without nohup it stops with 129, test_e2e_train)."""
    run = tmp_path / "runs" / "detect" / "n"
    args = ("train", str(tiny_data), "--epochs", "2", "--workers", "0", "--name", "n", *TINY)
    proc = cli.start(*args, prefix=("nohup",), start_new_session=True)
    training(run, proc, cli)
    os.killpg(proc.pid, signal.SIGHUP)
    r = cli.wait(proc, 300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert epochs_in(run) == [1, 2] and read_state(run).state == "finished"
    assert not events(run, "interrupted") and cli.leftovers() == []


def test_ctrl_z_stops_the_whole_training_tree_and_it_goes_on_when_continued(cli, tiny_data, tmp_path):
    """Ctrl-Z (SIGTSTP to the job): the supervisor stops the training tree (trainer, DataLoader workers, fork server)
    and itself, so nothing trains or burns the CPU while the job is stopped; continued (fg/bg: SIGCONT to the job),
    the tree goes on, the run finishes, and the pause is no hang, nor part of the time "done: ... in N s" says."""
    run = tmp_path / "runs" / "detect" / "z"
    args = ("train", str(tiny_data), "--epochs", "2", "--workers", "2", "--name", "z", *TINY)
    proc = cli.start(*args, start_new_session=True)
    training(run, proc, cli)
    supervisor = psutil.Process(proc.pid)
    os.killpg(proc.pid, signal.SIGTSTP)

    def tree_stopped() -> bool:
        try:
            members = [supervisor, *supervisor.children(recursive=True)]
            return len(members) >= 4 and all(p.status() in STOPPED for p in members)
        except psutil.NoSuchProcess:
            return False

    wait_for(tree_stopped, 60, "the supervisor and its whole tree stopped", proc, cli)
    beat = RunPaths(run).heartbeat.read_bytes()
    time.sleep(3)
    assert tree_stopped() and RunPaths(run).heartbeat.read_bytes() == beat  # nothing trained meanwhile
    os.killpg(proc.pid, signal.SIGCONT)
    r = cli.wait(proc, 300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert epochs_in(run) == [1, 2] and len(events(run, "suspended")) == len(events(run, "continued")) == 1
    assert read_state(run).hangs == [] and cli.leftovers() == []
    (started,), (finished,) = events(run, "started"), events(run, "finished")
    stopped = events(run, "continued")[0]["time"] - events(run, "suspended")[0]["time"]  # 3 s and more
    said = float(re.search(r"done: 2 epochs in ([\d.]+) s", r.stdout)[1])
    assert said <= finished["time"] - started["time"] - stopped + 1.5, (said, stopped)  # the time stopped is not in it


def test_a_terminal_that_goes_away_is_no_training_failure(cli, tiny_data, tmp_path):
    """``setsid rocm-yolo train ... &``, then the terminal closed: its writes fail with EIO. The run trains to the end
    on its profile, with no restart (the EIO was a training crash, restarted down the ladder), and the training
    output goes on in the run's log."""
    run = tmp_path / "runs" / "detect" / "t"
    master, slave = os.openpty()
    shown = bytearray()
    stop = threading.Event()

    def terminal():  # a terminal shows what it gets: its buffer never fills
        while not stop.is_set():
            if select.select([master], [], [], 0.1)[0]:
                try:
                    shown.extend(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=terminal, daemon=True)
    reader.start()
    args = ["train", str(tiny_data), "--epochs", "3", "--workers", "1", "--name", "t", *TINY]
    proc = cli.tagged.start(
        [sys.executable, "-m", "rocm_yolo", *args], cwd=tmp_path, output=slave, start_new_session=True
    )
    os.close(slave)
    try:
        beat = RunPaths(run).heartbeat
        deadline = time.monotonic() + 240
        while getattr(heartbeat.read(beat), "batches_total", 0) == 0:
            assert proc.poll() is None and time.monotonic() < deadline, shown.decode(errors="replace")[-3000:]
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join()
        os.close(master)  # the terminal window is closed
    assert b"rocm-yolo:" in shown  # it did write to the terminal until then
    assert proc.wait(timeout=300) == 0, RunPaths(run).log.read_text()[-3000:]
    state = read_state(run)
    assert epochs_in(run) == [1, 2, 3] and state.restarts == 0 and state.profile == "fast"
    assert len(events(run, "terminal_lost")) == 1 and cli.leftovers() == []
    log = RunPaths(run).log.read_text()
    after = log[log.index("the terminal is gone") :].splitlines()[1:]
    assert any("rocm-yolo" not in line and line.split("] ", 1)[-1].strip() for line in after)  # the output, kept
