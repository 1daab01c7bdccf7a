"""The command line: fast help, no torch in the CLI process, one-line usage errors with exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from rocm_yolo import launch, ucfg
from rocm_yolo.errors import UsageError


def rocm_yolo(*args, cwd=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "rocm_yolo", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def test_cli_imports_neither_torch_nor_ultralytics():
    code = ("import sys; from rocm_yolo import cli; cli.build_parser(); "
            "import rocm_yolo.launch, rocm_yolo.supervisor, rocm_yolo.status, rocm_yolo._child; "
            "bad = [m for m in ('torch', 'ultralytics', 'cv2', 'numpy') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_commands_and_exit_codes():
    r = rocm_yolo("--help")
    assert r.returncode == 0
    for word in ("train", "profiles", "status", "doctor", "130"):
        assert word in r.stdout
    t = rocm_yolo("train", "--help")
    assert t.returncode == 0
    for flag in ("--workers", "--profile", "--resume", "--stall-timeout", "--max-restarts", "--fallback", "KEY=VALUE"):
        assert flag in t.stdout


def test_profiles_command_lists_every_setting():
    r = rocm_yolo("profiles")
    assert r.returncode == 0
    for word in ("fast", "safe", "single", "persistent", "prefetch_factor", "pin_memory", "val workers",
                 "OMP_NUM_THREADS=2", "half the requested", "forkserver (preloaded)"):
        assert word in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["epocs=3"], "'epocs' is not a valid Ultralytics argument (did you mean 'epochs'?)"),
        (["imgsz=abc"], "'imgsz=abc' is not an image size"),
        (["lr0=fast"], "'lr0=fast' is not a number"),
        (["--workers", "-1"], "workers=-1 must be >= 0"),
        (["--workers", "1.5"], "is not an integer"),
        (["--profile", "turbo"], "invalid choice: 'turbo'"),
        (["--profile", "single", "prefetch_factor=2"], "prefetch_factor needs workers > 0"),
        (["threads=4"], "threads= sets the loader threads of --profile threads, not of 'fast'"),
        (["--epochs", "x"], "invalid int value: 'x'"),
        (["resume=True"], "use --resume"),
        (["--conv", "magic"], "invalid choice: 'magic'"),
        (["workers=2", "--workers", "3"], "'workers' is given twice"),
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


def test_key_values_are_parsed_like_ultralytics():
    assert launch.parse_key_values(["lr0=0.01", "cache=ram", "val=False", "close_mosaic=0"]) == {
        "lr0": 0.01, "cache": "ram", "val": False, "close_mosaic": 0}
    with pytest.raises(UsageError, match="not KEY=VALUE"):
        launch.parse_key_values(["epochs"])


def test_ultralytics_config_is_read_without_importing_it():
    cfg = ucfg.load()
    assert "epochs" in cfg.int_keys and "lr0" in cfg.fraction_keys and "val" in cfg.bool_keys
    assert cfg.task2model["detect"].endswith(".pt") and cfg.defaults["workers"] >= 0


def test_run_directories_follow_ultralytics_naming(tiny_data, tmp_path):
    project = tmp_path / "p"
    a = launch.make_spec(str(tiny_data), project=str(project), device="cpu")
    b = launch.make_spec(str(tiny_data), project=str(project), device="cpu")
    assert Path(a.run_dir).name == "train" and Path(b.run_dir).name == "train-2"
    assert a.train_args["exist_ok"] is True and a.model == ucfg.load().task2model["detect"]
    weights = project / "train" / "weights"
    weights.mkdir()
    (weights / "last.pt").write_bytes(b"x")
    with pytest.raises(UsageError, match="already holds weights/last.pt"):
        launch.make_spec(str(tiny_data), project=str(project), name="train", extra={"exist_ok": True})
