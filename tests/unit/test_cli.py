"""The command line: fast help, one-line usage errors with exit code 2, an internal error kept apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rocm_yolo import cli as cli_module
from rocm_yolo import errors


def rocm_yolo(*args, cwd=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "rocm_yolo", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def test_help_lists_commands_and_exit_codes():
    r = rocm_yolo("--help")
    assert r.returncode == 0
    for word in ("train", "profiles", "status", "doctor", "130"):
        assert word in r.stdout
    t = rocm_yolo("train", "--help")
    assert t.returncode == 0
    for flag in ("--workers", "--profile", "--resume", "--stall-timeout", "--max-restarts", "--fallback", "KEY=VALUE"):
        assert flag in t.stdout
    assert "0,1 for several GPUs" in t.stdout


def test_profiles_command_lists_every_setting():
    r = rocm_yolo("profiles")
    assert r.returncode == 0
    for word in (
        "fast",
        "safe",
        "single",
        "persistent",
        "prefetch_factor",
        "pin_memory",
        "val workers",
        "OMP_NUM_THREADS=2",
        "half the requested",
        "forkserver (preloaded)",
    ):
        assert word in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["epocs=3"], "'epocs' is not a valid Ultralytics argument (did you mean 'epochs'?)"),
        (["imgsz=abc"], "'imgsz=abc' is not an image size"),
        (["lr0=fast"], "'lr0=fast' is not a number"),
        (["--workers", "-1"], "workers=-1 must be >= 0"),
        (["--workers", "1.5"], "is not an integer"),
        (["--profile", "turbo"], "argument --profile: "),  # argparse's words for the rest: not asserted
        (["--profile", "single", "prefetch_factor=2"], "prefetch_factor needs workers > 0"),
        (["threads=4"], "threads= sets the loader threads of --profile threads, not of 'fast'"),
        (["--epochs", "x"], "argument --epochs: "),
        (["resume=True"], "use --resume"),
        (["--conv", "magic"], "argument --conv: "),
        (["workers=2", "--workers", "3"], "'workers' is given twice"),
        (["--epocs", "2"], "unrecognized arguments: --epocs 2 (did you mean --epochs?) (see 'rocm-yolo train --help')"),
        (["--device", "-1,-1"], "--device -1,-1: several devices must be GPU ids"),  # a value that starts with -
    ],
)
def test_usage_errors_are_one_line_exit_2(args, message, tiny_data, tmp_path):
    r = rocm_yolo("train", str(tiny_data), "--project", str(tmp_path / "runs"), *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_missing_data_and_missing_checkpoint(tmp_path):
    r = rocm_yolo("train", "nope/data.yaml", cwd=tmp_path)
    assert r.returncode == 2 and "data file not found: nope/data.yaml" in r.stderr
    r = rocm_yolo("train", cwd=tmp_path)
    assert r.returncode == 2 and "DATA is required" in r.stderr
    r = rocm_yolo("train", "--resume", "runs/detect/x/weights/last.pt", cwd=tmp_path)
    assert r.returncode == 2 and "checkpoint not found" in r.stderr
    r = rocm_yolo("train", "--resume", cwd=tmp_path)
    assert r.returncode == 2 and "no last.pt under" in r.stderr


def test_a_data_yaml_without_names_is_a_usage_error(tmp_path):
    bad = tmp_path / "d.yaml"
    bad.write_text("train: images/train\nval: images/val\n")
    r = rocm_yolo("train", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and "has no 'names' list" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_unreadable_checkpoint_is_a_clear_error(tmp_path):
    last = tmp_path / "runs" / "detect" / "train" / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"PK\x03\x04 not really a checkpoint")
    r = rocm_yolo("train", "--resume", str(last), cwd=tmp_path)
    assert r.returncode == 2 and "is unusable" in r.stderr and "Traceback" not in r.stderr
    assert last.read_bytes().startswith(b"PK")  # nothing lost


def test_an_internal_error_in_the_cli_is_not_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ROCM_YOLO_CACHE_DIR", str(tmp_path))

    def broken(args):
        return {}["missing"]  # a bug

    monkeypatch.setattr(cli_module, "cmd_profiles", broken)
    assert cli_module.main(["profiles"]) == errors.INTERNAL
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "internal error (a rocm-yolo bug" in err and "KeyError" in err
    [saved] = (tmp_path / "errors").glob("internal-*.txt")
    assert "Traceback" in saved.read_text() and str(saved) in err


@pytest.mark.parametrize("value", ["10x", "-1m"])
def test_cli_rejects_a_bad_interval_in_one_line_with_exit_2(value, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "train", "demo", "--checkpoint-every", value],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"rocm-yolo: error: --checkpoint-every {value}: write a time (30s, 10m, 1.5h), a number of batches (500ba), "
        "or 0 to turn mid-epoch checkpoints off"
    ]
    assert not (tmp_path / "runs").exists()  # nothing started, nothing claimed


def test_done_counts_from_the_resumed_checkpoint_not_from_results_csv(tmp_path):
    """A resume from epoch 2 (the verified copy) of a run whose results.csv holds 3 rows: the run trains epochs 3..6
    and results.csv ends on epoch 6 (the resume trimmed it): "epochs 3-6", not "4-6" or "3-7"."""
    import pickle
    from types import SimpleNamespace

    from helpers import fake_checkpoint
    from rocm_yolo.request import ending
    from rocm_yolo.run.midepoch_state import MID_EPOCH_KEY
    from rocm_yolo.ultralytics_rules import checkpoint

    results = tmp_path / "results.csv"
    results.write_text("epoch,   train/box_loss\n1,0.5\n2,0.4\n3,0.3\n")
    good = fake_checkpoint(tmp_path / "last_good.pt", pickle.dumps({"epoch": 1, "train_args": {"epochs": 6}}))
    spec = SimpleNamespace(resume=str(good), paths=SimpleNamespace(results=results))
    assert ending.trained_before(spec) == 2
    assert ending.trained_before(SimpleNamespace(resume=None, paths=spec.paths)) == 0
    stripped = fake_checkpoint(tmp_path / "last.pt", pickle.dumps({"epoch": -1, "train_args": {"epochs": 3}}))
    assert ending.trained_before(SimpleNamespace(resume=str(stripped), paths=spec.paths)) == 3  # results.csv
    mid = fake_checkpoint(tmp_path / "ep1-ba1.pt", pickle.dumps({"epoch": -1, MID_EPOCH_KEY: {}, "train_args": {}}))
    assert ending.trained_before(SimpleNamespace(resume=str(mid), paths=spec.paths)) == 0  # inside epoch 1
    results.write_text("epoch,   train/box_loss\n" + "".join(f"{e},0.1\n" for e in (1, 2, 3, 4, 5, 6)))
    assert checkpoint.last_epoch(results) == 6 and checkpoint.last_epoch(tmp_path / "none.csv") == 0


def test_help_says_what_the_code_does():
    """Issue 43: --help named no start_method= and no exit code 141, called exit 4 'a GPU fault (not retried)' (a GPU
    fault is retried once), and the description still said spawn-safe, as pyproject's did."""
    import tomllib

    from rocm_yolo.policy.profiles import LOADER_SETTINGS

    text = " ".join(cli_module.build_parser().commands["train"].format_help().split())
    assert [k for k in LOADER_SETTINGS if f"{k}=" not in text] == []
    codes = [errors.OK, errors.FAILED, errors.USAGE, errors.SETUP, errors.SAME_FAILURE, errors.INTERNAL]
    codes += [errors.HANGUP, errors.INTERRUPTED, errors.TERMINATED, errors.PIPE_CLOSED]
    assert [c for c in codes if str(c) not in text.split("exit codes:", 1)[1]] == []
    assert "came back after its one retry" in text and "spawn-safe" not in text
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "spawn" not in pyproject["project"]["description"]
