"""End to end, more than one GPU: Ultralytics' DDP with two ranks, under the watchdog, on the CPU.

The one seam: ``tests/seams/seam_cpu_ddp.py`` lets Ultralytics treat ``--device 0,1`` as two
CPU ranks with gloo (device selection, ``_setup_ddp``, ``device_ids``). Everything else is
real: ``torch.distributed.run``, two rank processes with their own fork servers and workers,
the all-reduce, real hangs and kills. Each run recovers to all its epochs, with one row per
epoch in ``results.csv``, and leaves nothing running.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import epochs_in, events, wait_for, with_cpu_ranks
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths

RECORD = "ROCM_YOLO_RECORD_BATCHES"
TRAIN_IMAGES = 16  # tiny_data: 16 train images; batch 4 on 2 ranks -> 2 a rank, 4 batches an epoch
DDP = ["--model", "yolo26n.yaml", "--device", "0,1", "--imgsz", "32", "--batch", "4", "plots=False"]
WATCH = ["--stall-timeout", "10", "--startup-grace", "120", "--workers", "1", "prefetch_factor=1"]


@pytest.fixture
def cli(cli):  # conftest's, which stops whatever a test left running
    return with_cpu_ranks(cli)


def rank_batches(record: Path, attempt: int, rank: int) -> dict:
    """(epoch, batch index) -> image files of one rank, as recorded."""
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    return {(r["epoch"], r["batch"]): r["files"] for r in rows if r["attempt"] == attempt and r["rank"] == rank}


def share(files: list[str], rank: int, epoch: int, batch: int) -> list[list[str]]:
    """What torch's DistributedSampler gives ``rank`` in the pass drawn with ``epoch`` (Ultralytics' seed 0),
    in batches: the order a resumed rank must replay."""
    sampler = torch.utils.data.DistributedSampler(range(len(files)), num_replicas=2, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    order = [files[i] for i in sampler]
    return [order[i : i + batch] for i in range(0, len(order), batch)]


@pytest.mark.quick
@pytest.mark.lowerbound
def test_a_worker_of_rank_1_hangs_and_both_ranks_resume_inside_the_epoch_with_their_own_samples(
    cli, tiny_data, tmp_path
):
    run = tmp_path / "runs" / "detect" / "train"
    record = tmp_path / "batches.jsonl"
    r = cli.run(
        "train",
        str(tiny_data),
        *DDP,
        *WATCH,
        "--epochs",
        "2",
        "--checkpoint-every",
        "2ba",
        "--fallback",
        "fast,single",
        env={"ROCM_YOLO_FAULT": "worker-hang@2:1:1", RECORD: str(record)},
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    assert epochs_in(run) == [1, 2] and cli.leftovers() == []
    [hang] = events(run, "hang")
    assert hang["epoch"] == 2 and "rank 1 at train batch" in r.stdout  # where each rank was last heard
    stacks = next(run.glob("hang-1-stacks.txt")).read_text()
    assert stacks.count("(rank,") == 2 and "block_forever" in stacks  # both ranks, and the stuck worker
    [restart] = events(run, "restart")
    assert restart["profile"] == "single" and "weights/ep2-ba" in restart["resume"]
    resumed, other = events(run, "resumed")  # each rank continues the epoch at the same batch
    assert (resumed["epoch"], resumed["batch"]) == (other["epoch"], other["batch"]) and {
        resumed["rank"],
        other["rank"],
    } == {
        0,
        1,
    }
    assert resumed["epoch"] == 2 and resumed["batch"] >= 2
    files = sorted(p.name for p in (tiny_data.parent / "images" / "train").iterdir())
    done = resumed["batch"]
    for rank in (0, 1):
        first, second = rank_batches(record, 1, rank), rank_batches(record, 2, rank)
        before = [first[(2, b)] for b in range(done)]  # what the rank trained of epoch 2 before the hang
        # the pass epoch 2 trained: drawn with sampler epoch 0..3 (workers prefetch across set_epoch)
        [order] = [p for p in (share(files, rank, e, 2) for e in range(4)) if p[:done] == before]
        assert sorted(b for e, b in second if e == 2) == list(range(done, len(order))), f"rank {rank}"
        assert [second[(2, b)] for b in range(done, len(order))] == order[done:], f"rank {rank}'s rest, in order"
    assert checkpoints.verify(run / "weights" / "last.pt") is None


def test_rank_1_stuck_before_a_collective_then_killed_recovers_each_time(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run(
        "train",
        str(tiny_data),
        *DDP,
        *WATCH,
        "--epochs",
        "2",
        env={"ROCM_YOLO_FAULT": "main-hang@1:2:1,kill@2:2:1"},
        timeout=500,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    assert epochs_in(run) == [1, 2] and cli.leftovers() == []
    [hang] = events(run, "hang")
    assert (hang["epoch"], hang["phase"]) == (1, "train")  # rank 0 waits in the all-reduce rank 1 never joins
    [crash] = events(run, "crash")
    assert crash["attempt"] == 2  # rank 1 SIGKILLed: torch.distributed.run stops rank 0, the launcher says so
    restarts = events(run, "restart")
    assert [e["profile"] for e in restarts] == ["safe", "threads"]
    assert restarts[1]["resume"].endswith("weights/last.pt")  # the end of epoch 1
    assert "done: 2 epochs" in r.stdout and checkpoints.verify(run / "weights" / "last.pt") is None
    assert (
        "resource_tracker" not in r.stdout
    )  # the killed rank's semaphores: no multiprocessing warning on the terminal


def test_ctrl_c_then_sigkill_of_the_resumed_supervisor_leave_no_rank_and_status_shows_each_rank(
    cli, tiny_data, tmp_path
):
    run = tmp_path / "runs" / "detect" / "train"
    beat = RunPaths(run).heartbeat
    proc = cli.start("train", str(tiny_data), *DDP, "--workers", "1", "--epochs", "300")
    wait_for(lambda: getattr(heartbeat.read(beat), "epoch", 0) > 1, 240, "epoch 2 on 2 ranks", proc, cli)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: one clean stop of every rank, no traceback of torch's launcher
    assert proc.wait(timeout=60) == 130
    out = cli.read()
    assert "Traceback" not in out and "resume with: rocm-yolo train --resume" in out, out[-3000:]
    assert cli.leftovers() == [] and not RunPaths(run).ranks_fifo.exists()  # the launcher removed its FIFO

    proc = cli.start("train", "--resume", str(run / "weights" / "last.pt"))  # on the run's own 2 GPUs
    wait_for(lambda: getattr(heartbeat.read(beat), "attempt", 0) == 2, 120, "the resumed attempt", proc, cli)
    wait_for(lambda: getattr(heartbeat.read(beat), "batches_total", 0) > 1, 240, "training again", proc, cli)
    rank1 = RunPaths(run).heartbeat_of(1)
    wait_for(lambda: getattr(heartbeat.read(rank1), "attempt", 0) == 2, 60, "rank 1's heartbeat", proc, cli)
    running = cli.leftovers(settle=0)
    # the CLI, the launcher, torch.distributed.run, 2 ranks, their fork servers and workers
    assert len(running) >= 7, [p.pid for p in running]
    status = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert status.returncode == 0 and "rank 1:" in status.stdout, status.stdout
    proc.send_signal(signal.SIGKILL)  # the supervisor gets no chance to clean up
    proc.wait()
    started = time.monotonic()
    assert cli.leftovers(settle=20) == []  # the launcher dies with it, torch.distributed.run and the ranks after
    assert time.monotonic() - started < 30
