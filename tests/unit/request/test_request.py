"""From what the user typed to a claimed run: validation, names, devices, resumes and data, without training."""

from __future__ import annotations

from pathlib import Path

import pytest

import rocm_yolo.request
from helpers import Cli, fake_checkpoint, kfd_tree, prepare, request
from rocm_yolo.errors import UsageError
from rocm_yolo.request import ownership
from rocm_yolo.request.train_request import TrainRequest, parse_key_values
from rocm_yolo.request.validation import make_spec
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.ultralytics_rules import config as ucfg
from taskdata import copy_task


@pytest.fixture
def four_gpus(tmp_path, monkeypatch):
    """This machine as one with four AMD GPUs (gfx1100), as rocm-yolo's device check reads it."""
    monkeypatch.setenv("ROCM_YOLO_KFD_ROOT", str(kfd_tree(tmp_path / "kfd", *[110000] * 4)))


def test_key_values_are_parsed_like_ultralytics():
    assert parse_key_values(["lr0=0.01", "cache=ram", "val=False", "close_mosaic=0"]) == {
        "lr0": 0.01,
        "cache": "ram",
        "val": False,
        "close_mosaic": 0,
    }
    with pytest.raises(UsageError, match="not KEY=VALUE"):
        parse_key_values(["epochs"])


def test_run_directories_follow_ultralytics_naming(tiny_data, tmp_path):
    project = tmp_path / "p"
    a = prepare(str(tiny_data), project=str(project), device="cpu")
    b = prepare(str(tiny_data), project=str(project), device="cpu")
    assert Path(a.run_dir).name == "train" and Path(b.run_dir).name == "train-2"
    assert a.train_args["exist_ok"] is True and a.model == ucfg.load().task2model["detect"]
    weights = project / "train" / "weights"
    weights.mkdir()
    (weights / "last.pt").write_bytes(b"x")
    with pytest.raises(UsageError, match="holds the checkpoint weights/last.pt of a run"):
        prepare(str(tiny_data), project=str(project), name="train", **{"exist_ok": True})


@pytest.mark.parametrize("name", ["../../escape", "/abs/path", "a/../../b", ".."])
def test_a_name_must_stay_inside_the_project(tiny_data, tmp_path, name):
    with pytest.raises(UsageError, match="must stay inside --project"):
        prepare(str(tiny_data), project=str(tmp_path / "p"), name=name, device="cpu")
    assert not (tmp_path / "p").exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "device, extra, message",
    [
        ("0,1,2", {}, "the default batch 16 does not divide by the 3 GPUs of --device 0,1,2"),
        ("0,1", {"batch": 5}, "batch=5 does not divide by the 2 GPUs of --device 0,1 (each rank trains batch/2"),
        (None, {"device": [0, 1], "batch": -1}, "batch=-1: AutoBatch and fractions work on one GPU only"),
        ("0,0", {}, "--device 0,0: a GPU is named twice"),
        ("-1,-1", {}, "--device -1,-1: several devices must be GPU ids, each named"),
        ("npu:0,1", {}, "several devices must be GPU ids"),
        ("0,1", {"batch": 8.0}, None),  # a whole-number float is that number
    ],
)
def test_a_multi_gpu_run_needs_a_batch_each_gpu_gets_a_share_of(four_gpus, tiny_data, tmp_path, device, extra, message):
    if message is None:
        assert make_spec(TrainRequest(str(tiny_data), project=str(tmp_path / "p"), device=device, overrides=extra))
        return
    with pytest.raises(UsageError) as e:  # extra: KEY=VALUE
        rocm_yolo.request.prepare(
            TrainRequest(str(tiny_data), project=str(tmp_path / "p"), device=device, overrides=extra)
        )
    assert message in str(e.value)
    assert not (tmp_path / "p").exists()  # refused before anything is written


@pytest.mark.parametrize("device, batch", [("0,1", None), ("0, 2", 8), ([0, 1, 2, 3], 32)])
def test_a_multi_gpu_run_is_one_spec_for_all_its_ranks(four_gpus, tiny_data, tmp_path, device, batch):
    from rocm_yolo.run.devices import world_size

    spec = make_spec(request(str(tiny_data), project=str(tmp_path / "p"), device=device, batch=batch))
    assert world_size(spec.train_args) == len(str(device).split(","))


def test_a_resume_outside_a_run_directory_is_refused(tmp_path):
    backup = fake_checkpoint(tmp_path / "backup" / "last.pt")
    with pytest.raises(UsageError, match="RUN/weights/last.pt") as e:
        prepare(resume=str(backup))
    assert "--model" in str(e.value) and not RunPaths(tmp_path).state.exists()  # tmp_path was not made a run


def _first_run(tiny_data, project, **extra):
    spec = prepare(str(tiny_data), project=str(project), model="yolo26n.yaml", workers=2, **extra)
    spec.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    return spec


def test_a_bare_resume_keeps_the_runs_own_settings(tiny_data, tmp_path):
    first = _first_run(tiny_data, tmp_path, val=False, timeout=60, pin_memory=False)
    again = prepare(resume=str(Path(first.run_dir) / "weights" / "last.pt"))
    assert again.profile == "fast" and again.loader.workers == 2 and again.attempt == 2
    assert again.val is False and again.loader.timeout == 60 and again.loader.pin_memory is False
    assert again.run_dir == first.run_dir and again.resume.endswith("last.pt")


def test_a_resume_on_another_profile_keeps_what_the_user_set_that_the_profile_can_take(tiny_data, tmp_path):
    first = _first_run(tiny_data, tmp_path, val=False, timeout=60, prefetch_factor=8)
    again = prepare(resume=True, project=str(tmp_path), profile="single")
    assert again.profile == "single" and again.loader.workers == 0 and again.workers_requested == 2
    assert again.val is False and again.loader.timeout == 60  # the user's own settings win over single's defaults
    assert again.loader.prefetch_factor is None and "prefetch_factor" not in again.user_keys  # single cannot take it
    assert "profile 'single' cannot take prefetch_factor=: dropped" in again.notes
    assert "resume changes the profile: fast -> single" in again.notes
    assert again.run_dir == first.run_dir


def test_the_interval_travels_in_the_spec_and_a_resume_keeps_it(tiny_data, tmp_path):
    spec = prepare(str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", checkpoint_every="250ba")
    assert spec.checkpoint_every == "250ba"
    assert RunSpec.from_json(spec.to_json()).checkpoint_every == "250ba"
    spec.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    again = prepare(resume=str(Path(spec.run_dir) / "weights" / "last.pt"))
    assert again.checkpoint_every == "250ba"
    default = prepare(str(tiny_data), project=str(tmp_path), name="other", model="yolo26n.yaml")
    assert default.checkpoint_every == "10m"


def test_each_default_is_declared_once_and_the_help_and_the_records_of_the_spec_take_it():
    """Issue 42: a default a user can change is declared once, in the record its option comes from (TrainRequest,
    WatchdogConfig); --help says it, and the records that travel in the spec (run/, which imports nothing of the
    request's) fall back on it for a spec made or read without it."""
    from dataclasses import fields

    from rocm_yolo.request.cluster import DEFAULT_RENDEZVOUS_TIMEOUT, parse_timeout
    from rocm_yolo.run.nodes import Nodes
    from rocm_yolo.supervisor.config import WatchdogConfig

    declared = {name: TrainRequest.default_of(name) for name in ("profile", "conv", "checkpoint_every", "rdzv_timeout")}
    assert declared == {"profile": "fast", "conv": "auto", "checkpoint_every": "10m", "rdzv_timeout": "10m"}
    spec = {f.name: f.default for f in fields(RunSpec)}
    assert (spec["conv"], spec["checkpoint_every"]) == (declared["conv"], declared["checkpoint_every"])
    timeout = next(f.default for f in fields(Nodes) if f.name == "timeout")
    assert timeout == DEFAULT_RENDEZVOUS_TIMEOUT == parse_timeout(declared["rdzv_timeout"]) == 600.0
    helps = {f.name: f.metadata["help"] for f in fields(TrainRequest) if "help" in f.metadata}
    for name in ("stall_timeout", "startup_grace", "max_restarts", "notify"):
        assert helps[name] == WatchdogConfig.help(name)
    assert "(default: 180, at least 10;" in helps["stall_timeout"] and helps["fallback"] == WatchdogConfig.help(
        "ladder"
    )
    assert "(default: 10m)" in helps["rdzv_timeout"] and "(default: 10m;" in helps["checkpoint_every"]
    assert "(default: fast;" in helps["profile"] and "(default: auto:" in helps["conv"]


def test_the_python_api_checks_the_ladder_before_it_claims_a_directory(tiny_data, tmp_path):
    import rocm_yolo

    for bad in ((), ("fast", "warp"), (1, 2)):
        with pytest.raises(UsageError):
            rocm_yolo.train(data=str(tiny_data), project=str(tmp_path), fallback=bad, device="cpu")
    assert not list(tmp_path.iterdir())


def test_data_that_does_not_fit_the_model_is_a_one_line_usage_error(task_data, tmp_path):
    cli = Cli(tmp_path)
    r = cli.run("train", str(task_data["classify"]), "--model", "yolo26n-seg.yaml", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stdout
    [line] = [x for x in r.stdout.splitlines() if x.strip()]
    assert "is a directory: a segment model trains on a dataset YAML" in line and "yolo26n-cls" in line
    assert not (tmp_path / "runs" / "segment" / "train").exists()
    with pytest.raises(UsageError, match="a classification model trains on a directory of class folders"):
        prepare(str(task_data["segment"]), model="yolo26n-cls.yaml", project=str(tmp_path / "p"))
    with pytest.raises(UsageError, match="'demo' is a detection data set"):
        prepare("demo", model="yolo26n-pose.yaml", project=str(tmp_path / "p"))


def test_cli_refuses_labels_ultralytics_would_refuse(task_data, tmp_path):
    pose = copy_task(task_data, "pose", tmp_path)
    pose.write_text(pose.read_text().replace("kpt_shape: [3, 3]", "kpt_shape: [3, 2]"))  # labels have 3 values each
    with pytest.raises(UsageError, match=r"train_000\.txt:1: 14 numbers, expected 11 .*kpt_shape \[3, 2\]"):
        prepare(str(pose), model="yolo26n-pose.yaml", project=str(tmp_path / "p"))
    obb = copy_task(task_data, "obb", tmp_path)
    (obb.parent / "labels/val/val_002.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(UsageError, match=r"val_002\.txt:1: a box .* where obb needs 9"):
        prepare(str(obb), model="yolo26n-obb.yaml", project=str(tmp_path / "p"))
    seg = copy_task(task_data, "segment", tmp_path)
    with open(seg.parent / "labels/train/train_003.txt", "a") as f:
        f.write("1 0.1 0.1 0.5 0.1 0.5\n")
    spec = prepare(str(seg), model="yolo26n-seg.yaml", project=str(tmp_path / "p"))
    ownership.release(spec.run_dir)
    [note] = [n for n in spec.notes if n.startswith("data:")]
    assert "1 of the first 8 train label files" in note and "train_003.txt:2: 6 numbers" in note


@pytest.mark.parametrize("key", ["stall_timeout", "startup_grace"])
def test_a_watchdog_too_short_to_tell_a_pause_from_a_hang_is_refused(key):
    """``--stall-timeout 1`` called the final validation a hang (issue 27): below 10 s it is a usage error, from the
    CLI and the Python API alike; 10 s is accepted."""
    flag = "--" + key.replace("_", "-")
    with pytest.raises(UsageError, match=f"^{flag} 1 is too short: .* give {flag} 10 or more$"):
        TrainRequest(**{key: 1}).watchdog_config()
    assert getattr(TrainRequest(**{key: 10}).watchdog_config(), key) == 10


def test_notify_comes_from_the_flag_or_the_environment_and_travels_in_the_watchdogs_config(monkeypatch):
    from rocm_yolo import cli

    monkeypatch.delenv("ROCM_YOLO_NOTIFY", raising=False)
    args, extra = cli.build_parser().parse_known_args(["train", "d.yaml", "--notify", "cat > /tmp/x"])
    assert TrainRequest.from_args(args, extra).watchdog_config().notify == "cat > /tmp/x"
    assert request("d.yaml").watchdog_config().notify is None
    monkeypatch.setenv("ROCM_YOLO_NOTIFY", "mail me")
    assert request("d.yaml").watchdog_config().notify == "mail me"
    assert request("d.yaml", notify="").watchdog_config().notify is None  # the flag wins, even to turn it off
    with pytest.raises(UsageError, match="shell command"):
        request("d.yaml", notify=["a"]).watchdog_config()
