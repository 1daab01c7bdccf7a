"""End to end: a run resumed on another number of GPUs continues exactly where it stopped (issue 41).

The CPU stand-in for GPUs (``tests/seams``: ``--device 0,1`` is two CPU ranks with gloo, ``--device 0`` one) and the
testing plugin's record of every trained image and optimizer step (``ROCM_YOLO_RECORD_BATCHES``). Each scenario: an
uninterrupted reference run; the same run stopped in epoch 2 by a SIGKILL of its trainer (rank 0) halfway through
writing a mid-epoch checkpoint at batch 2 or later, with no restart; then resumed by the user with
``--resume RUN --device ...`` on the other number of GPUs. The loaders run in the trainer (``--profile single``),
augmentation is off and ``deterministic=True``, so the reference and the resumed run draw the same samples; on fewer
GPUs every micro-batch is one the reference's ranks trained, and the weights at the end match the reference's. The
optimizer is SGD: AdamW divides each update by the gradient's running size, so for a parameter whose gradient is
near zero the last bits of the gradient sum (DDP's all-reduce against one GPU's accumulation) decide the update.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from helpers import Cli, epochs_in, events, rocm_lines, with_cpu_ranks
from rocm_yolo.request.demo import write_demo

IMAGES = 64
NO_AUGMENT = ["mosaic=0", "fliplr=0", "hsv_h=0", "hsv_s=0", "hsv_v=0", "translate=0", "scale=0", "close_mosaic=0"]
SAME = [
    *("--model", "yolo26n.yaml", "--imgsz", "32", "--epochs", "3", "--profile", "single", "--checkpoint-every", "1ba"),
    *("plots=False", "val=False", "seed=0", "deterministic=True", "optimizer=SGD", "lr0=0.01", *NO_AUGMENT),
]
RECORD = "ROCM_YOLO_RECORD_BATCHES"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_demo(tmp_path_factory.mktemp("relayout-data") / "d", train=IMAGES, val=4, size=48)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = with_cpu_ranks(Cli(tmp_path_factory.mktemp("relayout")))
    yield c
    c.kill_all()


def rows(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def steps(record: Path, attempt: int, epoch: int | None = None) -> dict[tuple[int, int], dict]:
    """(epoch, loop batch) -> the images of every rank at that step, each micro-batch's size, and whether the
    optimizer stepped after it."""
    out: dict = {}
    for r in rows(record):
        if r["attempt"] != attempt or (epoch is not None and r["epoch"] != epoch):
            continue
        step = out.setdefault((r["epoch"], r["batch"]), {"files": Counter(), "stepped": r["stepped"], "parts": []})
        step["files"] += Counter(r["files"])
        step["parts"] += r["parts"]
        assert step["stepped"] == r["stepped"], "the ranks step together"
    return out


def train(cli: Cli, data: Path, name: str, device: str, batch: int, *more: str, fault: str = "") -> dict:
    """A run of ``SAME`` on ``device``; with ``fault``, stopped by it and not restarted (the checkpoint before the
    one whose write it cuts short is whole: a write starts only once the one before it ended)."""
    record = cli.cwd / f"{name}.jsonl"
    env = {RECORD: str(record), **({"ROCM_YOLO_FAULT": fault} if fault else {})}
    args = ("--max-restarts", "0") if fault else ()
    r = cli.run("train", str(data), *SAME, "--device", device, "--batch", str(batch), "--name", name, *args, *more,
                env=env, timeout=600)  # fmt: skip
    assert r.returncode == (1 if fault else 0), r.stdout[-3000:]
    return {"run": cli.cwd / "runs" / "detect" / name, "record": record, "out": r}


def resume(cli: Cli, stopped: dict, device: str, *more: str, run: Path | None = None) -> dict:
    run = run or stopped["run"]
    record = stopped["record"]
    r = cli.run("train", "--resume", str(run), "--device", device, *more, env={RECORD: str(record)}, timeout=600)
    return {**stopped, "run": run, "out": r}


def resumed_at(run: Path) -> tuple[int, int]:
    found = events(run, "resumed")
    assert found, "the resume continued inside the epoch"
    return found[0]["epoch"], found[0]["batch"]


@pytest.fixture(scope="module")
def two_to_one(cli, data):
    """2 GPUs of 8 images (batch 16), stopped inside epoch 2, resumed on 1 GPU; and the uninterrupted reference."""
    reference = train(cli, data, "ref2", "0,1", 16)
    stopped = train(cli, data, "two", "0,1", 16, fault="save-kill@2:2")
    copies = {name: stopped["run"].with_name(f"two-{name}") for name in ("batch", "refused")}
    for copy in copies.values():  # for the resume with a new batch, and the one refused
        shutil.copytree(stopped["run"], copy)
    return {"ref": reference, "resumed": resume(cli, stopped, "0"), **copies}


@pytest.fixture(scope="module")
def one_to_two(cli, data):
    """1 GPU of 8 images, stopped in epoch 2, resumed on 2 GPUs; and the uninterrupted reference."""
    reference = train(cli, data, "ref1", "0", 8)
    stopped = train(cli, data, "one", "0", 8, fault="save-kill@2:2")
    return {"ref": reference, "resumed": resume(cli, stopped, "0,1")}


def check_each_image_once_and_each_step_as_the_reference(case: dict, gpu_batch: int) -> None:
    resumed, reference = case["resumed"], case["ref"]
    out = resumed["out"]
    assert out.returncode == 0, out.stdout[-3000:]
    run, record = resumed["run"], resumed["record"]
    assert epochs_in(run) == [1, 2, 3]
    epoch, done = resumed_at(run)
    assert epoch == 2 and done >= 1
    ref = steps(reference["record"], 1)
    before, after = steps(record, 1, epoch=2), steps(record, 2)
    # epoch 2: what the stopped attempt trained up to the checkpoint, and the resume from there: each image once
    trained = sum((before[(2, b)]["files"] for b in range(done)), Counter())
    trained += sum((s["files"] for (e, _), s in after.items() if e == 2), Counter())
    assert trained == Counter({f: 1 for f in ref_files(ref, 2)}), "each image of epoch 2 once"
    # every step from the checkpoint on: the reference's images, and the optimizer steps where it stepped
    assert sorted(after) == sorted(k for k in ref if k >= (2, done))
    for key, step in after.items():
        assert step["files"] == ref[key]["files"], key
        assert step["stepped"] == ref[key]["stepped"], key
        assert max(step["parts"]) <= gpu_batch, "no GPU's batch grew"


def ref_files(ref: dict, epoch: int) -> list[str]:
    return [f for (e, _), s in ref.items() if e == epoch for f in s["files"]]


def test_two_gpus_to_one_continues_the_epoch_with_the_same_steps_and_the_same_weights(two_to_one):
    check_each_image_once_and_each_step_as_the_reference(two_to_one, gpu_batch=8)
    resumed = two_to_one["resumed"]
    text = "\n".join(rocm_lines(resumed["out"].stdout))
    assert "world 2 -> 1 GPU: 2 micro-batches of 8 images a step on each GPU" in text
    [laid] = events(resumed["run"], "relayout")
    assert (laid["world_from"], laid["world_to"], laid["gpu_batch"], laid["micro_batches"]) == (2, 1, 8, 2)
    assert laid["accumulate"] == 4  # the run's own: round(nbs 64 / batch 16), not round(64 / 8)
    for step in steps(resumed["record"], 2).values():
        assert step["parts"] == [8, 8]  # two micro-batches, each one a rank of the reference trained
    import torch

    mine = torch.load(f"{resumed['record']}.weights.pt")  # the raw model's, float32, at the end of training
    theirs = torch.load(f"{two_to_one['ref']['record']}.weights.pt")
    assert mine.keys() == theirs.keys()
    worst = max((mine[k] - theirs[k]).abs().max().item() for k in mine)
    assert all(torch.allclose(mine[k], theirs[k], rtol=1e-4, atol=1e-6) for k in mine), f"differ by up to {worst}"


def test_one_gpu_to_two_splits_each_step_and_keeps_its_images(one_to_two):
    check_each_image_once_and_each_step_as_the_reference(one_to_two, gpu_batch=4)
    resumed = one_to_two["resumed"]
    laid = events(resumed["run"], "relayout")  # each rank says it
    assert sorted(e.get("rank", 0) for e in laid) == [0, 1]
    for e in laid:
        assert (e["world_from"], e["world_to"], e["gpu_batch"], e["micro_batches"], e["accumulate"]) == (1, 2, 4, 1, 8)


def test_a_new_global_batch_keeps_the_position_and_trains_what_the_epoch_has_left(cli, two_to_one):
    copy = two_to_one["batch"]
    record = cli.cwd / "two-batch.jsonl"
    lines = two_to_one["resumed"]["record"].read_text().splitlines()
    record.write_text("".join(x + "\n" for x in lines if json.loads(x)["attempt"] == 1))  # the stopped run's
    r = cli.run("train", "--resume", str(copy), "--device", "0", "--batch", "4", env={RECORD: str(record)},
                timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    [rest] = events(copy, "resume_rest")
    assert (rest["batch_from"], rest["batch_to"]) == (16, 4)
    done = rest["done"]  # steps of 16 images the checkpoint had done: the rest is the images after them
    assert rest["steps"] == (IMAGES - 16 * done) // 4 and resumed_at(copy) == (2, IMAGES // 4 - rest["steps"])
    before = sum((s["files"] for (e, b), s in steps(record, 1, epoch=2).items() if b < done), Counter())
    after = sum((s["files"] for (e, _), s in steps(record, 2).items() if e == 2), Counter())
    ref = steps(two_to_one["ref"]["record"], 1)
    assert before + after == Counter({f: 1 for f in ref_files(ref, 2)}), "each image of epoch 2 once"
    assert all(max(s["parts"]) <= 4 for s in steps(record, 2).values())
    assert epochs_in(copy) == [1, 2, 3]


def test_a_count_of_gpus_that_cannot_keep_each_step_is_refused_before_anything_starts(cli, two_to_one, tmp_path):
    nodes = tmp_path / "kfd"
    for index in range(5):  # a machine of 4 GPUs (and its CPU node)
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text(f"gfx_target_version {110000 if index else 0}\n")
    copy = two_to_one["refused"]
    before = sorted(p.name for p in (copy / "rocm_yolo").iterdir())
    r = cli.run("train", "--resume", str(copy), "--device", "0,1,2", env={"ROCM_YOLO_KFD_ROOT": str(nodes)})
    assert r.returncode == 2, r.stdout[-3000:]
    [line] = [x for x in rocm_lines(r.stdout) if "error:" in x]
    assert "--device 0,1,2" in line and "resume on 1, 2, 4 or 8 GPUs" in line and "batch=" in line
    assert "Traceback" not in r.stdout and sorted(p.name for p in (copy / "rocm_yolo").iterdir()) == before
    assert cli.leftovers() == []
