"""End to end (issue 43, item 3): a run's directory is what docs/watchdog.md says, for real.

A finished run's ``rocm-yolo.log`` ends with the line that says how it ended, it holds no empty file (the stack files
under ``rocm_yolo/stacks/`` aside: issue 45's), and ``weights/`` holds ``last.pt`` and ``best.pt`` alone; training it
on with ``--resume RUN --epochs N`` works from that ``last.pt``. While a run can still be resumed, its verified copy
``last_good.pt`` is the saved ``last.pt`` itself, a second name for the same file: no byte written for it.
"""

from __future__ import annotations

import os

import pytest

from helpers import TINY, Cli, epochs_in, rocm_lines
from rocm_yolo import errors
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state


def last_log_line(paths: RunPaths) -> str:
    return paths.log.read_text().strip().splitlines()[-1]


def empty_files(run) -> list[str]:
    return [
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.is_file() and p.stat().st_size == 0 and "stacks" not in p.relative_to(run).parts
    ]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data):
    root = tmp_path_factory.mktemp("finished")
    cli = Cli(root)
    r = cli.run("train", str(tiny_data), "--epochs", "1", "--workers", "1", *TINY, timeout=300)
    yield root, cli, r
    cli.kill_all()


def test_a_finished_runs_log_ends_with_its_end_and_weights_hold_last_and_best(finished):
    root, cli, r = finished
    assert r.returncode == 0, r.stdout[-3000:]
    paths = RunPaths(root / "runs" / "detect" / "train")
    [done] = [line for line in rocm_lines(r.stdout) if line.startswith("rocm-yolo: done: ")]
    assert last_log_line(paths).endswith("] " + done.removeprefix("rocm-yolo: "))  # the terminal's end, logged
    assert sorted(p.name for p in paths.weights.iterdir()) == ["best.pt", "last.pt"]
    assert empty_files(paths.run_dir) == []
    assert cli.leftovers() == []


def test_a_finished_run_trains_on_from_its_last_pt(finished):
    root, cli, _ = finished
    paths = RunPaths(root / "runs" / "detect" / "train")
    r = cli.run("train", "--resume", str(paths.run_dir), "--epochs", "2", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "training the finished run on from epoch 1 to 2, from the weights of last.pt" in r.stdout
    assert "changed: epochs 1 -> 2" in r.stdout and "done: epoch 2 in" in r.stdout
    assert epochs_in(paths.run_dir) == [1, 2] and read_state(paths.run_dir).state == "finished"
    assert sorted(p.name for p in paths.weights.iterdir()) == ["best.pt", "last.pt"]
    assert last_log_line(paths).split("] ", 1)[1].startswith("done: epoch 2 in")
    assert empty_files(paths.run_dir) == [] and cli.leftovers() == []


def test_the_verified_copy_of_a_resumable_run_is_its_last_pt_itself(cli, tiny_data, tmp_path):
    """A run that fails in epoch 2 (the trainer SIGKILLs itself, no watchdog to restart it) can be resumed: its
    last_good.pt is epoch 1's last.pt, the same file (a hard link); the resume finishes it, and then keeps none."""
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    args = ("train", str(tiny_data), "--epochs", "2", "--workers", "0", "--no-watchdog", *TINY)
    r = cli.run(*args, env={"ROCM_YOLO_FAULT": "kill@2:1"}, timeout=300)
    assert r.returncode == errors.FAILED, r.stdout[-3000:]
    assert epochs_in(paths.run_dir) == [1] and checkpoints.verify(paths.last_good) is None
    assert os.path.samefile(paths.last, paths.last_good) and os.stat(paths.last).st_nlink == 2
    assert last_log_line(paths).split("] ", 1)[1].startswith("failed after 0 restart(s)")
    r = cli.run("train", "--resume", str(paths.run_dir), timeout=300)
    assert r.returncode == 0 and epochs_in(paths.run_dir) == [1, 2], r.stdout[-3000:]
    assert sorted(p.name for p in paths.weights.iterdir()) == ["best.pt", "last.pt"] and cli.leftovers() == []
