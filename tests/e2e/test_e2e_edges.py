"""The edges, third round (issue 22): what a resume promises, what a stop says, and the user's folder, for real.

Real trainings on the CPU (tiny data, imgsz 32), real processes and real files: a resume onto another
number of GPUs keeps the run's global batch or is refused; GPUs the machine does not have are refused
before any process starts; a finished run's refusal advises what works, and that advice trains it
further (``--resume RUN --epochs N``); a key a resume cannot honour is refused; an empty split and a
run that fails before its first epoch leave a reused folder as it was.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from helpers import TINY, Cli, epochs_in, rocm_lines
from rocm_yolo import errors
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state

SEAM_TOPOLOGY = Path(__file__).resolve().parents[1] / "seams" / "kfd" / "nodes"  # two gfx1100 GPUs


def one_line(r, code: int) -> str:
    """The one rocm-yolo line of a refused command (no traceback)."""
    assert r.returncode == code, r.stdout[-3000:]
    assert "Traceback" not in r.stdout, r.stdout[-3000:]
    [line] = [x for x in rocm_lines(r.stdout) if "error" in x]
    return line


def files_of(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data):
    """A run that trained its one epoch to the end."""
    root = tmp_path_factory.mktemp("edges")
    cli = Cli(root)
    r = cli.run("train", str(tiny_data), "--epochs", "1", "--name", "done", *TINY, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert not list((root / "runs" / "detect" / "done" / "weights").glob(".*.tmp"))  # a finished run keeps none
    yield root, root / "runs" / "detect" / "done"
    cli.kill_all()


def test_a_resume_onto_gpus_that_cannot_share_out_the_runs_steps_is_refused_and_touches_nothing(finished, tmp_path):
    """The run trained batch=4 on one device: 3 GPUs cannot share each step's 4 images out exactly (issue 41)."""
    _, run = finished
    before = files_of(run)
    r = Cli(tmp_path).run("train", "--resume", str(run), "--epochs", "2", "--device", "0,1,2", timeout=60)
    line = one_line(r, errors.USAGE)
    assert "--device 0,1,2: the run trains 4 images a step on one GPU, which 3 GPUs cannot share out" in line
    assert "resume on 1, 2 or 4 GPUs, or give batch=N to start a new global batch on purpose" in line
    assert files_of(run) == before


@pytest.mark.quick
def test_gpus_the_machine_does_not_have_are_refused_before_anything_starts(tiny_data, tmp_path):
    """A machine with two GPUs (the DDP seam's KFD topology, as rocm-yolo reads an AMD machine's): four are refused
    at once, in one line, with no run directory and no rank started (it took 17 to 56 s and a line per rank)."""
    cli = Cli(tmp_path)
    cli.env["ROCM_YOLO_KFD_ROOT"] = str(SEAM_TOPOLOGY)
    started = time.monotonic()
    r = cli.run("train", str(tiny_data), "--device", "0,1,2,3", "--batch", "16", "--epochs", "1", timeout=120)
    line = one_line(r, errors.USAGE)
    assert "--device 0,1,2,3 names GPU 3, but this machine shows 2 (ids 0,1)" in line
    assert not (tmp_path / "runs").exists() and cli.leftovers() == []
    assert time.monotonic() - started < 60  # not a measurement: a bound far above the few seconds it takes


def test_a_finished_run_is_told_what_works_and_that_trains_it_further(finished, tmp_path):
    """exist_ok=True onto one's own finished run: not "another run"; the advice --resume RUN --epochs N works, with
    the header saying what changed, the schedule of the new count, and results.csv going on 1..N."""
    root, run = finished
    cli = Cli(root)
    r = cli.run("train", "--resume", str(run), "lr0=0.02", timeout=60)
    assert "a resume keeps the run's lr0" in one_line(r, errors.USAGE)
    r = cli.run("train", "--resume", str(run), "--epochs", "2", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "changed: epochs 1 -> 2" in r.stdout and "training the finished run on from epoch 1 to 2" in r.stdout
    assert "done: epoch 2" in r.stdout
    assert epochs_in(run) == [1, 2]
    paths = RunPaths(run)
    assert checkpoints.verify(paths.last) is None and not paths.last_good.exists()  # trained on from last.pt
    assert read_state(run).state == "finished" and cli.leftovers() == []
    with open(run / "args.yaml") as f:
        assert "epochs: 2" in f.read()  # Ultralytics' record of the run's arguments follows


def test_exist_ok_onto_a_finished_run_advises_what_works(finished, tiny_data, tmp_path):
    root, run = finished
    r = Cli(root).run("train", str(tiny_data), "--name", "done", "exist_ok=True", *TINY, timeout=60)
    line = one_line(r, errors.USAGE)
    assert "holds a run that finished all" in line and "another run" not in line
    assert f"--resume {run} --epochs N" in line and f"--model {run / 'weights' / 'last.pt'}" in line


@pytest.mark.parametrize("how", ["empty val", "internal error"])
def test_a_run_that_fails_before_its_first_epoch_leaves_a_reused_folder_as_it_was(tiny_data, tmp_path, how):
    """exist_ok=True onto the user's folder with a results.csv: an empty val folder is refused before any process
    starts; a run that fails in set-up puts the folder's results.csv back; no stack file of it is left there."""
    mine = tmp_path / "P" / "mywork"
    mine.mkdir(parents=True)
    (mine / "results.csv").write_text("epoch,loss\n1,0.5\n")
    data = tiny_data
    env = None
    if how == "empty val":
        (tmp_path / "empty").mkdir()
        data = tmp_path / "emptyval.yaml"
        data.write_text(tiny_data.read_text().replace("val: images/val", f"val: {tmp_path / 'empty'}"))
    else:
        env = {"ROCM_YOLO_FAULT": "bug@setup"}
    cli = Cli(tmp_path)
    r = cli.run(
        "train", str(data), "--project", str(tmp_path / "P"), "--name", "mywork", "exist_ok=True", *TINY, env=env
    )
    if how == "empty val":
        assert "holds no images" in one_line(r, errors.USAGE)
    else:
        assert r.returncode == errors.INTERNAL, r.stdout[-3000:]
    assert (mine / "results.csv").read_text() == "epoch,loss\n1,0.5\n"
    assert not list(mine.rglob("trainer-*.txt")) and not (mine / "results.before-run.csv").exists()
    assert not list(mine.rglob(".*.tmp")) and cli.leftovers() == []


def test_results_csv_has_each_epoch_once(finished):
    _, run = finished
    with open(run / "results.csv") as f:
        epochs = [int(float(row["epoch"])) for row in csv.DictReader(f)]
    assert epochs == sorted(set(epochs))


def test_a_loader_with_fewer_workers_than_requested_says_why(tmp_path):
    """Issue 22, item 9: the header restored workers=2 (Ultralytics sets 0 on the CPU), and then the train loader
    line said workers=0: Ultralytics' build_dataloader gives a loader of one batch no workers. The log says so."""
    data = write_demo(tmp_path / "four", train=4, val=4, size=64)
    cli = Cli(tmp_path)
    r = cli.run("train", str(data), "--epochs", "1", "--workers", "2", *TINY, "val=False", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    lines = rocm_lines(r.stdout)
    [loader] = [x for x in lines if "train loader:" in x]
    assert "workers=0" in loader
    [why] = [x for x in lines if "gave the train loader workers=0 of the requested 2" in x]
    assert "1 batch per epoch" in why
    assert cli.leftovers() == []
