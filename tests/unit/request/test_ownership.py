"""One supervisor per run directory: real processes claiming and holding run directories."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import fake_checkpoint, prepare
from rocm_yolo.errors import UsageError
from rocm_yolo.request import ownership
from rocm_yolo.run.paths import RunPaths

CLAIMER = """
import json, sys, time
from rocm_yolo import request
start = float(sys.argv[3])
while time.time() < start:
    pass
spec = request.prepare(request.TrainRequest(sys.argv[1], project=sys.argv[2], device="cpu"))
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
            "import sys; from rocm_yolo.request import ownership; "
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


HOLDER = (
    "import sys; from rocm_yolo.request import ownership; "
    "ownership.acquire(sys.argv[1], None if sys.argv[2] == '-' else int(sys.argv[2])); "
    "print('held', flush=True); sys.stdin.read()"
)


def _hold(run: Path, node: int | None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run), "-" if node is None else str(node)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_one_supervisor_per_node_of_a_run(tmp_path):
    run = tmp_path / "runs" / "train"
    node0, node1 = _hold(run, 0), _hold(run, 1)  # the nodes of one run hold it together
    try:
        assert ownership.holder(run, 0) == node0.pid and ownership.holder(run, 1) == node1.pid
        with pytest.raises(
            UsageError, match=f"in use by another rocm-yolo supervisor for node 1 \\(pid {node1.pid}\\)"
        ):
            ownership.acquire(run, 1)  # a second supervisor of node 1
        with pytest.raises(
            UsageError, match=f"the rocm-yolo supervisors of its nodes \\(node 0 pid {node0.pid}, node 1"
        ):
            ownership.acquire(run)  # a supervisor on one machine while the nodes train
        assert ownership.holder(run) == 0  # held (shared), no PID of its own
        ownership.acquire(run, 2)  # a third node
        ownership.release(run, 2)
    finally:
        for proc in (node0, node1):
            proc.stdin.close()
            proc.wait(timeout=30)
    one = _hold(run, None)
    try:
        with pytest.raises(UsageError, match=f"in use by another rocm-yolo supervisor \\(pid {one.pid}\\)"):
            ownership.acquire(run, 0)  # a node while one machine trains the run
        assert not ownership.held(run, 0) and ownership.holder(run, 0) is None  # its node lock went back
    finally:
        one.stdin.close()
        one.wait(timeout=30)
    ownership.acquire(run, 0)
    assert ownership.held(run, 0) and not ownership.held(run)
    ownership.release(run, 0)
