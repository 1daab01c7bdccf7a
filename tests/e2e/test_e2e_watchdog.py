"""End to end: real hangs and real kills in real Ultralytics training, caught by the watchdog.

Each test makes a genuine fault (a DataLoader worker or the trainer blocking forever, a worker
killed with SIGKILL) and checks that the supervisor notices it within the stall timeout plus
10 s, writes the stacks (or the traceback), kills the whole tree, resumes down the fallback
ladder, finishes every requested epoch with a continuous results.csv, and leaves no process.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from helpers import TINY, epochs_in, events
from rocm_yolo.process import tree
from rocm_yolo.run import checkpoints, heartbeat
from rocm_yolo.run.paths import RunPaths

pytestmark = pytest.mark.e2e


STALL = 10  # --stall-timeout for these tests (the default is 180 s)


WATCH = ["--stall-timeout", str(STALL), "--startup-grace", "90", "--workers", "2", "prefetch_factor=1"]


def check_recovered(cli, r, run: Path, epochs: int, hung_at: float | None = None) -> dict:
    assert r.returncode == 0, r.stdout[-4000:]
    assert epochs_in(run) == list(range(1, epochs + 1)), "results.csv must be continuous"
    assert cli.leftovers() == []
    [restart] = events(run, "restart")
    assert restart["profile"] == "safe" and "restart 1/3 with profile 'safe'" in r.stdout
    assert checkpoints.verify(run / "weights" / "last.pt") is None
    if hung_at is not None:
        [hang] = events(run, "hang")
        assert hang["time"] - hung_at <= STALL + 10, "detected within the stall timeout plus 10 s"
        return hang
    return restart


def stacks(run: Path) -> str:
    [path] = run.glob("hang-1-stacks.txt")
    return path.read_text()


@pytest.mark.lowerbound
def test_worker_blocking_forever_mid_run(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run("train", str(tiny_data), "--epochs", "3", *WATCH, *TINY, env={"ROCM_YOLO_FAULT": "worker-hang@2:1"})
    fired = RunPaths(run).fault_fired("worker-hang").stat().st_mtime
    hang = check_recovered(cli, r, run, 3, hung_at=fired)
    assert hang["epoch"] == 2 and hang["phase"] == "train"
    text = stacks(run)
    worker_part = text[text.index("(worker,") :]
    assert "block_forever" in worker_part and "__getitem__" in worker_part  # where the worker is stuck
    assert "_try_get_data" in text[: text.index("(worker,")]  # the trainer waits for its batch
    if tree.find_py_spy():  # installed with the test extra: native stacks too
        assert "py-spy dump --native (exit 0)" in text
    assert "from /" in r.stdout and "weights/last.pt" in events(run, "restart")[0]["resume"]


def test_trainer_blocking_forever_before_the_first_checkpoint_restarts_in_the_same_directory(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run("train", str(tiny_data), "--epochs", "2", *WATCH, *TINY, env={"ROCM_YOLO_FAULT": "main-hang@1:2"})
    fired = RunPaths(run).fault_fired("main-hang").stat().st_mtime
    hang = check_recovered(cli, r, run, 2, hung_at=fired)
    assert hang["epoch"] == 1 and hang["batch"] in (1, 2)  # as of the last heartbeat (written at most 1/s)
    trainer_part = stacks(run).split("=====")[1]
    assert "(trainer," in trainer_part and "block_forever" in trainer_part and "on_train_batch_end" in trainer_part
    [restart] = events(run, "restart")
    assert restart["resume"] is None and "from the start (no checkpoint yet)" in r.stdout
    assert not (tmp_path / "runs" / "detect" / "train-2").exists()


def test_worker_killed_with_sigkill(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    proc = cli.start("train", str(tiny_data), "--epochs", "3", *WATCH, *TINY)
    deadline = time.monotonic() + 180
    victim = None
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        hb = heartbeat.read(RunPaths(run).heartbeat)
        if hb and hb.epoch >= 2 and hb.phase == "train":
            records = [json.loads(x) for x in RunPaths(run).workers.read_text().splitlines()]
            alive = [w["pid"] for w in records if psutil.pid_exists(w["pid"])]
            victim = alive[0] if alive else None
        time.sleep(0.05)
    assert victim is not None, "no live worker found in epoch 2"
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=240)
    out = cli.read()
    r = type("R", (), {"returncode": proc.returncode, "stdout": out})
    check_recovered(cli, r, run, 3)
    [crash] = events(run, "crash")
    assert crash["time"] - killed_at <= STALL + 10
    [trace] = run.glob("crash-1.txt")
    assert "DataLoader worker" in trace.read_text() and str(victim) in trace.read_text()
