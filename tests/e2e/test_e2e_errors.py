"""End to end: honest error classes and one supervisor per run, with real processes.

A live run and a second supervisor, a broken torch on PYTHONPATH, an injected bug, a disk that
fills up under a real training run (a small tmpfs, where this machine lets us mount one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import TINY, Cli, rocm_lines, wait_for
from rocm_yolo import errors
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state


def one_error_line(output: str, code_seen: int, code: int, needle: str) -> str:
    assert code_seen == code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in rocm_lines(output) if needle in line]
    assert lines, output[-3000:]
    return lines[0]


@pytest.mark.quick
def test_a_data_yaml_whose_path_is_a_file_leaves_no_run_directory(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"path: {bad}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n")
    r = cli.run("train", str(bad), *TINY, timeout=60)
    line = one_error_line(r.stdout, r.returncode, errors.USAGE, "error:")
    assert "is a file" in line and not (tmp_path / "runs").exists()


@pytest.mark.e2e
def test_a_concurrent_resume_is_refused_and_the_live_run_stays_intact(cli, tiny_data, tmp_path):
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    # long enough to be running whatever the machine's speed; stopped with Ctrl-C once the others are refused
    live = cli.start("train", str(tiny_data), "--epochs", "300", "--workers", "1", *TINY)
    wait_for(lambda: paths.last_good.exists(), 180, "the first checkpoint", live, cli)
    second = Cli(tmp_path)
    for args in (["--resume", str(paths.last)], [str(tiny_data), "--name", "train", "exist_ok=True", *TINY]):
        r = second.run("train", *args, timeout=60)
        line = one_error_line(r.stdout, r.returncode, errors.USAGE, "in use by another rocm-yolo supervisor")
        assert f"(pid {live.pid})" in line
    assert live.poll() is None, cli.read()[-3000:]
    live.send_signal(signal.SIGINT)
    assert live.wait(timeout=120) == 130, cli.read()[-3000:]
    assert [p.name for p in paths.specs()] == ["spec-1.json"]  # the refused ones wrote nothing
    assert not paths.results_backup.exists() and checkpoints.verify(paths.last) is None
    with open(paths.results) as f:  # each epoch once, in order: no second trainer wrote into it
        epochs = [int(float(row.split(",")[0])) for row in f.read().splitlines()[1:]]
    assert epochs and epochs == list(range(1, len(epochs) + 1))
    assert cli.leftovers() == [] and second.leftovers() == []


@pytest.mark.e2e
def test_a_broken_torch_is_a_setup_error_named_and_never_retried(cli, tiny_data, tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise OSError("libamdhip64.so.6: cannot open shared object file")\n')
    env = {"PYTHONPATH": str(fake.parent)}
    r = cli.run("train", str(tiny_data), "--epochs", "1", *TINY, env=env, timeout=120)
    line = one_error_line(r.stdout, r.returncode, errors.SETUP, "environment error")
    assert "torch cannot be imported (OSError: libamdhip64.so.6" in line and "restart" not in r.stdout
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    assert "libamdhip64" in paths.setup_error(1).read_text() and [p.name for p in paths.specs()] == ["spec-1.json"]
    assert read_state(paths.run_dir).state == "setup_failed"
    doc = cli.run("doctor", str(tiny_data), "--skip", "kernel,shm,start", "--json", env=env, timeout=120)
    report = json.loads(doc.stdout[doc.stdout.index("{") :])
    rows = {row["check"]: row for row in report["rows"]}
    assert doc.returncode == 1 and rows["versions.torch"]["status"] == "fail"
    assert "fails to import: OSError: libamdhip64.so.6" in rows["versions.torch"]["found"]
    assert rows["loader.single"]["status"] == "skip" and "torch cannot be imported" in report["conclusion"]
    assert cli.leftovers() == []


@pytest.mark.e2e
def test_an_injected_bug_is_an_internal_error_not_a_usage_error(cli, tiny_data, tmp_path):
    r = cli.run("train", str(tiny_data), "--epochs", "1", *TINY, env={"ROCM_YOLO_FAULT": "bug@setup"}, timeout=120)
    line = one_error_line(r.stdout, r.returncode, errors.INTERNAL, "internal error (a rocm-yolo bug")
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    assert str(paths.internal_error(1)) in line and "InjectedBug" in paths.internal_error(1).read_text()
    assert "restart" not in r.stdout and "error: " not in r.stdout.replace("internal error", "")
    assert read_state(paths.run_dir).state == "internal_error" and cli.leftovers() == []


def test_a_check_ultralytics_makes_while_it_builds_the_loaders_is_the_users(cli, tmp_path):
    """9 images in batches of 4 leave a last batch of 1, which Ultralytics refuses at imgsz 32 (BatchNorm would get
    one value per channel) in _build_train_pipeline: a usage error in one line, not a rocm-yolo bug."""
    data = write_demo(tmp_path / "nine", train=9, val=4, size=64)
    r = cli.run("train", str(data), "--epochs", "1", *TINY, timeout=120)
    one_error_line(r.stdout, r.returncode, errors.USAGE, "error")
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    assert "internal error" not in r.stdout and not paths.internal_error(1).exists()
    assert cli.leftovers() == []


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int):
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(r.stderr or r.stdout).strip()}): needs root or CAP_SYS_ADMIN")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 4096):  # megabytes, then the last blocks
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)


@pytest.mark.e2e
def test_a_full_disk_stops_the_run_keeps_its_checkpoint_and_says_so(cli, tiny_data, tmp_path):
    # A checkpoint with its optimizer state is 21 MB (Ultralytics 8.4.158) to 26 MB (8.4.190): on a 32 MB disk
    # last.pt fits and best.pt does not. Each save is atomic (patches/saves/epoch_save): best.pt's cut-short temporary
    # file is removed, never left as a truncated best.pt.
    with small_tmpfs(tmp_path / "disk", 32) as disk:
        paths = RunPaths(disk / "runs" / "train")
        r = cli.run("train", str(tiny_data), "--epochs", "3", "--workers", "1", "--project", str(disk / "runs"), *TINY)
        line = one_error_line(r.stdout, r.returncode, errors.SETUP, "environment error")
        assert "no space left on device" in line and "restart" not in r.stdout
        assert not paths.best.exists() or checkpoints.verify(paths.best) is None  # never a truncated file
        assert not list(paths.weights.glob(".*.tmp")) and not list(paths.run_dir.glob("internal-*.txt"))
        assert checkpoints.verify(paths.last) is None and f"the last loadable checkpoint is {paths.last}" in r.stdout
        assert "Traceback" in paths.setup_error(1).read_text() and read_state(paths.run_dir).state == "setup_failed"
        status = Cli(tmp_path).run("status", str(paths.run_dir), timeout=60).stdout
        assert "state:     setup_failed (environment error: no space left on device" in status  # not "stopped"
        assert cli.leftovers() == []
        # the disk quite full: a new run cannot even write its spec; one line, exit 4, nothing left running
        _fill(disk)
        again = Cli(tmp_path)
        r = again.run("train", str(tiny_data), "--project", str(disk / "runs"), "--name", "again", *TINY, timeout=60)
        assert "no space left on device" in one_error_line(r.stdout, r.returncode, errors.SETUP, "environment error")
        assert again.leftovers() == []
        # a read-only disk: resuming the run there, or starting one, is one line and exit 4
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for args in (["--resume", str(paths.last)], [str(tiny_data), "--project", str(disk / "runs"), *TINY]):
            r = Cli(tmp_path).run("train", *args, timeout=60)
            line = one_error_line(r.stdout, r.returncode, errors.SETUP, "environment error")
            assert "read-only file system" in line.lower()
