"""One supervisor per run directory: real processes claiming and holding run directories."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import fake_checkpoint, prepare
from rocm_yolo.errors import UsageError
from rocm_yolo.launch import ownership
from rocm_yolo.run.paths import RunPaths

CLAIMER = """
import json, sys, time
from rocm_yolo import launch
start = float(sys.argv[3])
while time.time() < start:
    pass
spec = launch.prepare(launch.TrainRequest(sys.argv[1], project=sys.argv[2], device="cpu"))
print("RUN", spec.run_dir, flush=True)
sys.stdin.read()  # hold the run (and its lock) until the test lets go
"""


def test_eight_processes_started_together_get_eight_directories(tiny_data, tmp_path):
    project = tmp_path / "runs"
    start = time.time() + 4  # every process spins until the same instant, then claims
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(tiny_data), str(project), str(start)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    try:
        dirs = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("RUN "), line
            dirs.append(Path(line.split(" ", 1)[1].strip()))
        assert len(set(dirs)) == 8 and {d.parent for d in dirs} == {project}
        holders = {ownership.holder(d) for d in dirs}
        assert holders == {p.pid for p in procs}  # each holds its own directory while it lives
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    assert all(ownership.holder(d) is None for d in dirs)  # the kernel dropped every lock at exit


def test_a_held_run_is_refused_and_a_stale_lock_is_no_lock(tmp_path):
    run = tmp_path / "runs" / "train"
    last = fake_checkpoint(RunPaths(run).last)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from rocm_yolo.launch import ownership; "
            f"ownership.acquire({str(run)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in run.rglob("*"))
        with pytest.raises(UsageError, match=f"in use by another rocm-yolo supervisor \\(pid {holder.pid}\\)"):
            prepare(resume=str(last))
        with pytest.raises(UsageError, match="in use"):
            ownership.acquire(run)
        assert sorted(p.name for p in run.rglob("*")) == before  # nothing touched
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert RunPaths(run).lock.read_text().strip() == str(holder.pid)  # the stale file stays; it is no lock
    spec = prepare(resume=str(last))
    assert ownership.held(spec.run_dir)
    ownership.release(spec.run_dir)
