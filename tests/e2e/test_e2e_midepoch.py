"""End to end: mid-epoch checkpoints in real CPU training, real kills and a real hang, resumed inside the epoch.

One uninterrupted reference run (``--profile single``, ``seed=0 deterministic=True``, no mid-epoch checkpoints)
records the image files of every batch. A run that writes checkpoints every 6 batches, killed with SIGKILL in the
middle of a checkpoint write in epoch 2 (still in warm-up) and resumed with ``--resume``, must end with the
reference's weights and losses; a copy of it resumed with another batch keeps its place in the epoch; a worker
hang under ``fast`` is resumed by the watchdog inside the epoch, on another profile, with the reference's samples
in the reference's order and at most the interval plus one batch trained again. A stop (SIGTERM to the supervisor)
in the middle of a checkpoint's write waits for it, or, when the write outlasts the grace the tree gets, its
temporary file goes (the plugin ``midsave_stop`` beside this file). No run leaves a temporary file.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from helpers import Cli, events
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths

pytestmark = pytest.mark.e2e


EPOCH_BATCHES = 16  # 32 images, batch 2


SAME = [
    "--model",
    "yolo26n.yaml",
    "--device",
    "cpu",
    "--imgsz",
    "32",
    "--batch",
    "2",
    "plots=False",
    "val=False",
    "seed=0",
    "deterministic=True",
]


RECORD = "ROCM_YOLO_RECORD_BATCHES"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_demo(tmp_path_factory.mktemp("mid-data") / "d", train=2 * EPOCH_BATCHES, val=4, size=64)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    cli = Cli(tmp_path_factory.mktemp("mid"))
    yield cli
    cli.kill_all()


def batches(record: Path, attempt: int | None = None) -> dict:
    """(epoch, batch index) -> image files, as recorded by the training child."""
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    return {(r["epoch"], r["batch"]): r["files"] for r in rows if attempt is None or r["attempt"] == attempt}


def losses(run: Path) -> list[tuple]:
    with open(run / "results.csv") as f:
        return [
            (
                row["epoch"].strip(),
                row["train/box_loss"].strip(),
                row["train/cls_loss"].strip(),
                row["train/l1_loss"].strip(),
            )
            for row in csv.DictReader(f)
        ]


def weights(path: Path) -> dict:
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return {k: v.float() for k, v in (ckpt.get("ema") or ckpt["model"]).state_dict().items()}


@pytest.fixture(scope="module")
def reference(runner, data):
    """The uninterrupted run, without mid-epoch checkpoints: taking them must not change the training either."""
    run = runner.cwd / "runs" / "reference"
    r = runner.run(
        "train",
        str(data),
        *SAME,
        "--epochs",
        "3",
        "--profile",
        "single",
        "--checkpoint-every",
        "0",
        "--project",
        str(run.parent),
        "--name",
        run.name,
        env={RECORD: str(runner.cwd / "reference.jsonl")},
    )
    assert r.returncode == 0, r.stdout[-3000:]
    return run, batches(runner.cwd / "reference.jsonl")


@pytest.fixture(scope="module")
def killed(runner, data):
    """A run SIGKILLed halfway through writing its second mid-epoch checkpoint of epoch 2 (no restarts)."""
    run = runner.cwd / "runs" / "killed"
    r = runner.run(
        "train",
        str(data),
        *SAME,
        "--epochs",
        "3",
        "--profile",
        "single",
        "--checkpoint-every",
        "6ba",
        "--max-restarts",
        "0",
        "--project",
        str(run.parent),
        "--name",
        run.name,
        env={"ROCM_YOLO_FAULT": "save-kill@2:12"},
    )
    assert r.returncode == 1 and "exited with code -9" in r.stdout, r.stdout[-3000:]
    copy = run.with_name("killed-copy")
    shutil.copytree(run, copy)  # for the resume with another batch
    return run, copy


def test_a_kill_during_the_write_leaves_the_previous_checkpoint_which_loads_in_plain_ultralytics(killed, data):
    from ultralytics import YOLO

    run, _ = killed
    paths = RunPaths(run)
    [(epoch, done, mid)] = paths.mid_checkpoints()
    assert (epoch, done) == (2, 6) and checkpoints.verify(mid) is None
    # the killed write, never renamed into place: at batch 12, or later if the write of batch 6 was still running;
    # its temporary file went with the tree, and the run said so
    [cut] = events(run, "write_cut_short")
    assert int(re.fullmatch(r"ep2-ba(\d+)\.pt", cut["target"])[1]) >= 12
    assert not list(paths.weights.glob(".*.tmp")) and not (paths.weights / cut["target"]).exists()
    with zipfile.ZipFile(mid) as z:  # unpickling it needs no rocm-yolo class: plain types and tensors only
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"rocm_yolo." not in pickled and b"rocm_yolo_mid_epoch" in pickled
    model = YOLO(str(mid))  # as plain Ultralytics loads last.pt
    image = sorted(data.parent.glob("images/val/*.png"))[0]
    assert len(model.predict(str(image), imgsz=32, device="cpu", verbose=False)) == 1
    assert model.ckpt["epoch"] == 0  # the last completed epoch, so Ultralytics' own resume starts epoch 2


def test_resumed_inside_the_epoch_it_ends_exactly_as_the_uninterrupted_run(runner, killed, reference):
    run, _ = killed
    ref_run, _ = reference
    r = runner.run("train", "--resume", str(run / "weights" / "last.pt"), "--checkpoint-every", "8ba")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "resuming from the mid-epoch checkpoint ep2-ba6.pt" in r.stdout
    assert "resumed at epoch 2/3, batch 6/16 from ep2-ba6.pt; continuing with batch 7" in r.stdout
    assert losses(run) == losses(ref_run)  # each epoch's row once, with the uninterrupted run's losses
    mine, theirs = weights(run / "weights" / "last.pt"), weights(ref_run / "weights" / "last.pt")
    assert mine.keys() == theirs.keys()
    worst = max((mine[k] - theirs[k]).abs().max().item() for k in mine)
    assert worst <= 1e-6, f"weights differ by up to {worst}"
    # housekeeping: the newest good checkpoint is kept, an epoch's go with its last.pt, a finished run keeps none,
    # nor the verified copy of last.pt: weights/ holds last.pt and best.pt
    written = [(e["epoch"], e["batch"], e["removed"]) for e in events(run, "mid_checkpoint")]
    # a checkpoint due while the previous one is still being written goes to the next batch (no stall): 12 or later
    assert written[1][0] == 1 and written[1][1] >= 12 and written[1][2] == ["ep1-ba6.pt"]
    assert written[:1] + written[2:] == [
        (1, 6, []),
        (2, 6, []),  # then killed writing ep2-ba12 (or later)
        (2, 14, ["ep2-ba6.pt"]),
        (3, 8, []),
    ]  # resumed, every 8 batches now
    assert not list((run / "weights").glob("ep*")) and not list((run / "weights").glob(".*.tmp"))
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["best.pt", "last.pt"]
    assert runner.leftovers() == []


def test_another_batch_keeps_the_position_and_trains_the_rest_of_the_epoch_in_its_steps(runner, killed):
    """A new global batch on purpose (batch 2 -> 4): the position is kept (issue 41), the epoch goes on with the
    images the checkpoint had not trained, in steps of the new batch, ending where its epoch ends."""
    _, copy = killed
    proc = runner.start("train", "--resume", str(copy / "weights" / "last.pt"), "--batch", "4")
    try:  # once it trains the rest of epoch 2, that is all this test needs: stop it (SIGTERM)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            hb = heartbeat.read(RunPaths(copy).heartbeat)
            if hb is not None and hb.attempt == 2 and hb.phase == "train" and hb.batches_total >= 1:
                break
            time.sleep(0.2)
        # 8 batches of 4 an epoch now; the checkpoint had done 6 of 2 (12 images): 20 left, 5 steps, from step 3
        assert hb.epoch >= 2 and hb.batches == 8 and (hb.epoch > 2 or hb.batch >= 4), hb
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = runner.read()
    assert "a new global batch (2 -> 4 images a step): the 20 images epoch 2 has left, in 5 steps" in out
    [rest] = events(copy, "resume_rest")
    assert (rest["batch_from"], rest["batch_to"], rest["done"], rest["steps"]) == (2, 4, 6, 5)
    assert "resumed at epoch 2/3, batch 6/16 from ep2-ba6.pt; continuing with batch 4 of 8" in out
    assert runner.leftovers() == []


@pytest.mark.parametrize("write", [2, 60], ids=["waited-for", "cut-short"])
def test_a_stop_during_a_mid_epoch_checkpoints_write_waits_for_it_or_leaves_no_temporary_file(runner, data, write):
    """SIGTERM to the supervisor (Ctrl-C, scancel) while the first mid-epoch checkpoint is half written: the trainer
    ends only once the write did (2 s more), and the checkpoint is there, whole; a write longer than the tree's grace
    (8 s: SIGTERM, then SIGKILL) is cut short, and its temporary file goes with the tree, said in one line."""
    run = runner.cwd / "runs" / f"midsave-stop-{write}"
    plugin = {
        "ROCM_YOLO_PLUGINS": "midsave_stop",
        "PYTHONPATH": os.pathsep.join(x for x in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if x),
        "ROCM_YOLO_TEST_MIDSAVE_STOP": str(write),
    }
    r = runner.run(
        "train",
        str(data),
        *SAME,
        "--epochs",
        "1",
        "--profile",
        "single",
        "--checkpoint-every",
        "4ba",
        "--project",
        str(run.parent),
        "--name",
        run.name,
        env=plugin,
    )
    paths = RunPaths(run)
    assert r.returncode == 143 and (paths.state / "midsave-stop.fired").exists(), r.stdout[-3000:]
    assert not list(paths.weights.glob(".*.tmp")) and runner.leftovers() == []
    target = paths.mid_checkpoint(1, 4)
    if write == 2:
        assert checkpoints.verify(target) is None and [e["batch"] for e in events(run, "mid_checkpoint")] == [4]
        assert "resume with: rocm-yolo train --resume" in r.stdout and not events(run, "write_cut_short")
    else:
        assert not target.exists() and not events(run, "mid_checkpoint")
        line = f"the write of {target} was cut short as the training process ended: its temporary file is removed"
        assert line in r.stdout


def test_a_worker_hang_resumes_inside_the_epoch_with_the_same_samples(runner, data, reference):
    _, ref = reference
    run = runner.cwd / "runs" / "hang"
    record = runner.cwd / "hang.jsonl"
    r = runner.run(
        "train",
        str(data),
        *SAME,
        "--epochs",
        "2",
        "--workers",
        "1",
        "prefetch_factor=1",
        "--checkpoint-every",
        "10ba",
        "--stall-timeout",
        "10",
        "--startup-grace",
        "90",
        "--fallback",
        "fast,single",
        "--project",
        str(run.parent),
        "--name",
        run.name,
        env={"ROCM_YOLO_FAULT": "worker-hang@2:13", RECORD: str(record)},
    )
    assert r.returncode == 0, r.stdout[-3000:]
    [restart] = events(run, "restart")
    assert restart["profile"] == "single" and restart["resume"].endswith("weights/ep2-ba10.pt")
    [resumed] = events(run, "resumed")
    assert (resumed["epoch"], resumed["batch"]) == (2, 10)
    first, second = batches(record, attempt=1), batches(record, attempt=2)
    reached = max(b for (e, b) in first if e == 2) + 1  # batches of epoch 2 the hung attempt trained
    assert min(b for (e, b) in second if e == 2) == 10
    assert reached - 10 <= 11, "work lost: at most the interval plus one batch"
    assert all(files == ref[key] for key, files in second.items()), "the reference's samples, in its order"
    assert sorted(second) == [(2, b) for b in range(10, EPOCH_BATCHES)]
    [record_] = json.loads((run / "rocm_yolo" / "supervisor.json").read_text())["recoveries"]
    assert record_["resumed_at"] == [2, 10] and record_["cause"] == "hang"
    assert 0 <= record_["retrained_batches"] <= reached - 10  # as of the last heartbeat (at most a second old)
    assert record_["retrained_batches"] == reached - 10  # exact: every finished batch reaches the supervisor
    assert "batches trained again" in r.stdout
    status = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert "resumed at epoch 2, batch 10 from ep2-ba10.pt" in status.stdout
    assert runner.leftovers() == []
