"""Every way into a run directory goes through its owner; numbers are finite; a finished run is left alone.

No training: real files, fake and real checkpoints, the real validation and claim.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import zipfile
from pathlib import Path

import pytest

import rocm_yolo
from helpers import as_stranger, fake_checkpoint, prepare
from rocm_yolo.errors import UsageError
from rocm_yolo.request import ownership
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.supervisor.config import WatchdogConfig


def checkpoint(path: Path, epoch: int, epochs: int = 3, mid: bool = False) -> Path:
    """A checkpoint dict as Ultralytics (or rocm-yolo mid-epoch) writes one, without tensors."""
    ckpt = {"epoch": epoch, "train_args": {"epochs": epochs, "task": "detect"}}
    if mid:
        ckpt["rocm_yolo_mid_epoch"] = {"epoch": epoch + 1, "batch": 4}
    return fake_checkpoint(path, payload=pickle.dumps(ckpt))


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- a finished run


@pytest.mark.parametrize("epoch", [-1, 2])  # stripped by the end of training (-1), or the last epoch's save
def test_resuming_a_finished_run_is_refused_before_anything_is_written(tmp_path, epoch):
    run = tmp_path / "runs" / "detect" / "train"
    checkpoint(RunPaths(run).last, epoch)
    before = snapshot(tmp_path)
    with pytest.raises(
        UsageError, match="has already finished all 3 epochs: train it further with rocm-yolo train --resume"
    ) as e:
        prepare(resume=str(RunPaths(run).last))
    assert f"--resume {run} --epochs N" in str(e.value) and f"--model {RunPaths(run).last}" in str(e.value)
    assert snapshot(tmp_path) == before and not ownership.held(run)  # not even the lock file


def test_a_finished_run_with_a_damaged_last_pt_is_refused_and_the_damaged_file_stays(tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    paths = RunPaths(run)
    checkpoint(paths.last_good, 2)
    paths.last.write_bytes(paths.last_good.read_bytes()[:100])  # cut short by a stop in the final save
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="already finished"):
        prepare(resume=str(paths.last))
    assert snapshot(tmp_path) == before  # not moved aside: nothing is changed


def test_a_finished_run_trains_on_to_more_epochs_from_its_last_pt(tmp_path):
    """--resume RUN --epochs N of a finished run: from last.pt, stripped by the end of training (its weights; the
    training process gives it a new optimizer), changing nothing before the run is held; fewer epochs than trained are
    refused. A run that still has a checkpoint of its last epoch with the optimizer (an end cut short, or a run of an
    older rocm-yolo that kept last_good.pt) goes on from that one, which becomes last.pt again."""
    run = tmp_path / "runs" / "detect" / "train"
    paths = RunPaths(run)
    checkpoint(paths.last, -1)  # stripped by the end of training
    paths.results.write_text("epoch,loss\n1,0.5\n2,0.4\n3,0.3\n")
    before = snapshot(tmp_path)
    for few in (2, 3):
        with pytest.raises(UsageError, match="already finished all 3 epochs"):
            prepare(resume=str(run), epochs=few)
    assert snapshot(tmp_path) == before
    spec = prepare(resume=str(run), epochs=5)
    assert spec.resume == str(paths.last) and spec.train_args["epochs"] == 5
    assert any("from epoch 3 to 5, from the weights of last.pt" in n and "a new one starts" in n for n in spec.notes)
    assert paths.last.read_bytes() == before["runs/detect/train/weights/last.pt"][1]  # the trainer makes it resumable
    ownership.release(spec.run_dir)
    checkpoint(paths.last_good, 2)  # an older run's verified copy of its last epoch's save, with the optimizer
    spec = prepare(resume=str(run), epochs=5)
    assert spec.resume == str(paths.last) and paths.last.read_bytes() == paths.last_good.read_bytes()
    assert any("from epoch 3 to 5, from last_good.pt" in n for n in spec.notes)
    ownership.release(spec.run_dir)


def test_a_resume_refuses_what_it_would_drop(tmp_path):
    """Ultralytics' resume keeps the run's own lr0, amp, ...: given on a resume, they are refused, not dropped."""
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    checkpoint(paths.last, 0)
    before = snapshot(tmp_path)
    for given, word in (({"lr0": 0.02}, "lr0=0.02: a resume keeps the run's lr0"), ({"model": "x.yaml"}, "--model")):
        with pytest.raises(UsageError, match=word):
            prepare(resume=str(paths.last), **given)
    with pytest.raises(UsageError, match="has trained 1 epochs already"):
        prepare(resume=str(paths.last), epochs=1)
    assert snapshot(tmp_path) == before


def test_an_unfinished_run_still_resumes_and_a_mid_epoch_one_too(tmp_path):
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    checkpoint(paths.last, 0, mid=False)
    spec = prepare(resume=str(paths.last))
    assert spec.resume == str(paths.last)
    ownership.release(spec.run_dir)
    checkpoint(paths.mid_checkpoint(3, 4), 1, mid=True)  # the final epoch, inside it: not finished
    os.utime(paths.last, (1, 1))
    spec = prepare(resume=str(paths.last))
    assert spec.resume == str(paths.mid_checkpoint(3, 4))
    ownership.release(spec.run_dir)


# --------------------------------------------------------------------------- other runs' directories


@pytest.mark.parametrize("left", ["last_good.pt", "ep1-ba4.pt"])
def test_a_reused_directory_with_any_checkpoint_of_another_run_is_refused(tiny_data, tmp_path, left):
    project = tmp_path / "p"
    checkpoint(project / "work" / "weights" / left, 0)
    with pytest.raises(UsageError, match=f"holds the checkpoint weights/{left} of a run that has not finished"):
        prepare(str(tiny_data), project=str(project), name="work", **{"exist_ok": True})
    assert not ownership.held(project / "work")


def test_a_reused_directory_is_not_this_runs_own_and_its_reports_are_kept(tiny_data, tmp_path):
    run = tmp_path / "p" / "work"
    (run / "notes.txt").parent.mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    (RunPaths(run).state).mkdir()
    RunPaths(run).spec(1).write_text("{}")  # an earlier attempt's spec, even one that cannot be read
    spec = prepare(str(tiny_data), project=str(tmp_path / "p"), name="work", **{"exist_ok": True})
    ownership.release(spec.run_dir)
    assert spec.created is False and spec.attempt == 2  # never overwrites spec-1.json, crash-1.txt, ...
    fresh = prepare(str(tiny_data), project=str(tmp_path / "p"), name="new")
    ownership.release(fresh.run_dir)
    assert fresh.created is True and fresh.attempt == 1


def test_cfg_file_keys_go_through_the_same_checks(tiny_data, tmp_path):
    other = tmp_path / "runs" / "detect" / "A" / "weights" / "last.pt"
    checkpoint(other, 0)
    for line in (f"resume: {other}", "resume: true", "mode: val", "save_dir: /elsewhere"):
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(line + "\n")
        with pytest.raises(UsageError, match=r"cfg=.*|not a valid Ultralytics argument"):
            prepare(str(tiny_data), project=str(tmp_path / "p"), name="B", **{"cfg": str(cfg)})
    assert not (tmp_path / "p").exists()
    cfg.write_text(f"project: {tmp_path / 'q'}\nname: from-cfg\nepochs: 7\nlr0: 0.02\nresume: false\nmode: train\n")
    spec = prepare(str(tiny_data), epochs=2, **{"cfg": str(cfg)})
    ownership.release(spec.run_dir)
    assert spec.run_dir == str(tmp_path / "q" / "from-cfg") and spec.created  # claimed as the flags would be
    assert spec.train_args["epochs"] == 2 and spec.train_args["lr0"] == 0.02 and "cfg" not in spec.train_args


def test_a_cfg_file_or_data_yaml_that_is_a_fifo_is_refused_not_read(tiny_data, tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is a FIFO, not a regular file"):
        prepare(str(tiny_data), project=str(tmp_path / "p"), **{"cfg": str(fifo)})
    with pytest.raises(UsageError, match="is a FIFO, not a regular file"):
        prepare(str(fifo), project=str(tmp_path / "p"))


def test_a_symlinked_data_yaml_is_handed_on_as_named(tiny_data, tmp_path):
    link = tmp_path / "set" / "data.yaml"
    link.parent.mkdir()
    link.symlink_to(tiny_data)
    spec = prepare(str(link), project=str(tmp_path / "p"))
    ownership.release(spec.run_dir)
    assert spec.data == str(link) and spec.train_args["data"] == str(link)


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "extra",
    [
        {"batch": math.inf},
        {"batch": math.nan},
        {"lr0": math.inf},
        {"imgsz": [640, math.nan]},
        {"timeout": math.nan},
        {"workers": math.inf},
    ],
)
def test_a_number_that_is_not_finite_is_a_usage_error(tiny_data, tmp_path, extra):
    with pytest.raises(UsageError, match="finite|not an integer"):
        prepare(str(tiny_data), project=str(tmp_path / "p"), **dict(extra))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("field", ["stall_timeout", "startup_grace"])
def test_the_watchdog_refuses_a_timeout_that_would_switch_it_off(tiny_data, tmp_path, field):
    for value in (math.nan, math.inf, 0, -1):
        with pytest.raises(UsageError, match=f"--{field.replace('_', '-')} {value}: give a number of seconds > 0"):
            WatchdogConfig(**{field: value})
    with pytest.raises(UsageError, match=f"{field}=nan: give a number of seconds > 0"):
        rocm_yolo.train(data=str(tiny_data), project=str(tmp_path / "p"), **{field: math.nan})
    assert not (tmp_path / "p").exists()


# --------------------------------------------------------------------------- another version's files


def test_a_spec_of_another_version_is_read_where_it_can_be_and_never_overwritten(tiny_data, tmp_path):
    first = prepare(str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", workers=2)
    ownership.release(first.run_dir)
    paths = RunPaths(first.run_dir)
    first.save()
    newer = json.loads(paths.spec(1).read_text())
    newer["a_field_of_a_later_version"] = 1
    paths.spec(1).write_text(json.dumps(newer))  # readable: unknown fields are left out
    checkpoint(paths.last, 0)
    again = prepare(resume=str(paths.last))
    ownership.release(again.run_dir)
    assert again.attempt == 2 and again.loader.workers == 2
    paths.spec(2).write_text('{"run_dir": 3}')  # unreadable: the next attempt still comes after it
    paths.spec(1).unlink()
    third = prepare(resume=str(paths.last))
    ownership.release(third.run_dir)
    assert third.attempt == 3 and any("spec-2.json cannot be read" in n for n in third.notes)


def test_a_plain_zip_is_no_checkpoint_to_resume(tmp_path):
    last = tmp_path / "runs" / "detect" / "train" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    with zipfile.ZipFile(last, "w") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(UsageError, match="no data.pkl"):
        prepare(resume=str(last))


# --------------------------------------------------------------------------- what another user plants (issue 45)


def test_a_lock_planted_as_a_link_is_refused_and_its_target_untouched(tiny_data, tmp_path):
    """Training into a folder someone else prepared (exist_ok=True) once wrote the supervisor's pid through a
    ``lock`` link, over the file it named."""
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    run = tmp_path / "p" / "work"
    RunPaths(run).state.mkdir(parents=True)
    RunPaths(run).lock.symlink_to(victim)
    with pytest.raises(UsageError) as refused:
        prepare(str(tiny_data), project=str(tmp_path / "p"), name="work", **{"exist_ok": True})
    assert "symbolic link" in str(refused.value) and "\n" not in str(refused.value)
    assert victim.read_text() == "the user's file" and not ownership.held(run)


@pytest.mark.parametrize("planted", ["run", "state"])
def test_a_run_or_state_folder_that_is_a_link_is_refused_and_nothing_written_where_it_points(
    tiny_data, tmp_path, planted
):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "rocm_yolo").mkdir(parents=True)
    run = tmp_path / "p" / "work"
    run.parent.mkdir()
    if planted == "run":
        run.symlink_to(elsewhere)
    else:
        run.mkdir()
        RunPaths(run).state.symlink_to(elsewhere / "rocm_yolo")
    with pytest.raises(UsageError, match="is a symbolic link"):
        prepare(str(tiny_data), project=str(tmp_path / "p"), name="work", **{"exist_ok": True})
    assert list((elsewhere / "rocm_yolo").iterdir()) == []


def test_another_users_run_folder_is_refused(tiny_data, tmp_path):
    run = tmp_path / "p" / "work"
    RunPaths(run).state.mkdir(parents=True)
    as_stranger(run, RunPaths(run).state)
    with pytest.raises(UsageError, match="belongs to another user"):
        prepare(str(tiny_data), project=str(tmp_path / "p"), name="work", **{"exist_ok": True})
    assert list(RunPaths(run).state.iterdir()) == []


def test_a_bare_resume_and_a_restart_look_only_at_the_users_own_checkpoints(tmp_path):
    """Another user's run under a shared project, newer than the user's own: a bare --resume passes it over, and no
    checkpoint of theirs (nor a link to one) is ever resumed from: Ultralytics unpickles it whole."""
    project = tmp_path / "runs"
    mine = checkpoint(project / "mine" / "weights" / "last.pt", 0)
    os.utime(mine, (1, 1))
    theirs = checkpoint(project / "theirs" / "weights" / "last.pt", 1)
    as_stranger(theirs.parent.parent, theirs.parent, theirs)
    assert checkpoints.find_latest(project) == mine
    assert "another user" in checkpoints.verify(theirs)
    linked = project / "mine" / "weights" / "ep1-ba9.pt"  # a mid-epoch name, newer than last.pt: a restart's pick
    linked.symlink_to(theirs)
    assert "symbolic link" in checkpoints.verify(linked)
    assert checkpoints.plan_resume_point(mine).path == mine


def test_a_resume_on_gpus_the_machine_does_not_have_names_the_runs_device(tmp_path, monkeypatch):
    """The run trained on GPU 3; resumed where the machine shows two: the line says it is the run's device (the user
    gave none), and how to resume on what this machine has."""
    from helpers import kfd_tree

    monkeypatch.setenv("ROCM_YOLO_KFD_ROOT", str(kfd_tree(tmp_path / "kfd", 110000, 110000)))
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    fake_checkpoint(paths.last, pickle.dumps({"epoch": 0, "train_args": {"epochs": 3, "device": "3", "batch": 4}}))
    before = snapshot(tmp_path / "runs")
    with pytest.raises(UsageError) as caught:
        prepare(resume=str(paths.last))
    assert str(caught.value) == (
        "the run trained on device 3, and this machine shows 2 GPU(s) to a run: resume on the GPUs it has with "
        "--device 0"
    )
    assert snapshot(tmp_path / "runs") == before
