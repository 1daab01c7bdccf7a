"""One supervisor per run, honest error classes, paths and devices (issue 10).

Real processes throughout: a live run and a second supervisor, eight processes claiming run
directories at the same instant, a broken torch on PYTHONPATH, an injected bug, a disk that
fills up under a real training run (a small tmpfs, where this machine lets us mount one).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from conftest import TINY, Cli, rocm_lines, wait_for
from rocm_yolo import checkpoints, cli as cli_module, errors, launch, ownership, proctree
from rocm_yolo.errors import UsageError
from rocm_yolo.paths import RunPaths
from rocm_yolo.supervisor import read_state


def fake_checkpoint(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("last/data.pkl", b"x" * 100)
    return path


def one_error_line(output: str, code_seen: int, code: int, needle: str) -> str:
    assert code_seen == code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in rocm_lines(output) if needle in line]
    assert lines, output[-3000:]
    return lines[0]


# --------------------------------------------------------------------------- paths and devices


@pytest.mark.parametrize("name", ["../../escape", "/abs/path", "a/../../b", ".."])
def test_a_name_must_stay_inside_the_project(tiny_data, tmp_path, name):
    with pytest.raises(UsageError, match="must stay inside --project"):
        launch.make_spec(str(tiny_data), project=str(tmp_path / "p"), name=name, device="cpu")
    assert not (tmp_path / "p").exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("device, extra", [("0,1", {}), (None, {"device": [0, 1]}), ("0, 2", {})])
def test_a_multi_gpu_device_is_refused(tiny_data, tmp_path, device, extra):
    with pytest.raises(UsageError, match="multi-GPU training is not supported yet"):
        launch.make_spec(str(tiny_data), project=str(tmp_path / "p"), device=device, extra=dict(extra))
    assert not (tmp_path / "p").exists()


def test_a_resume_outside_a_run_directory_is_refused(tmp_path):
    backup = fake_checkpoint(tmp_path / "backup" / "last.pt")
    with pytest.raises(UsageError, match="RUN/weights/last.pt") as e:
        launch.make_spec(resume=str(backup))
    assert "--model" in str(e.value) and not RunPaths(tmp_path).state.exists()  # tmp_path was not made a run


def test_a_data_yaml_whose_path_is_a_file_leaves_no_run_directory(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"path: {bad}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n")
    r = cli.run("train", str(bad), *TINY, timeout=60)
    line = one_error_line(r.stdout, r.returncode, errors.USAGE, "error:")
    assert "is a file" in line and not (tmp_path / "runs").exists()


def test_status_survives_badly_typed_state_files(tmp_path):
    paths = RunPaths(tmp_path / "run")
    paths.state.mkdir(parents=True)
    paths.heartbeat.write_text(json.dumps({"seq": "x", "pid": [], "phase": 3}))
    paths.supervisor.write_text(json.dumps({"state": 7, "restarts": "two", "hangs": "many"}))
    for args in ([], ["--json"]):
        r = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(paths.run_dir), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert read_state(paths.run_dir) is None


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


# --------------------------------------------------------------------------- one supervisor per run


CLAIMER = """
import json, sys, time
from rocm_yolo import launch
start = float(sys.argv[3])
while time.time() < start:
    pass
spec = launch.make_spec(sys.argv[1], project=sys.argv[2], device="cpu")
print("RUN", spec.run_dir, flush=True)
sys.stdin.read()  # hold the run (and its lock) until the test lets go
"""


def test_eight_processes_started_together_get_eight_directories(tiny_data, tmp_path):
    project = tmp_path / "runs"
    start = time.time() + 4  # every process spins until the same instant, then claims
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(tiny_data), str(project), str(start)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        dirs = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("RUN "), line
            dirs.append(Path(line.split(" ", 1)[1].strip()))
        assert len(set(dirs)) == 8 and {d.parent for d in dirs} == {project}
        holders = {ownership.holder(d) for d in dirs}
        assert holders == {p.pid for p in procs}  # each holds its own directory while it lives
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
    assert all(ownership.holder(d) is None for d in dirs)  # the kernel dropped every lock at exit


def test_a_held_run_is_refused_and_a_stale_lock_is_no_lock(tmp_path):
    run = tmp_path / "runs" / "train"
    last = fake_checkpoint(RunPaths(run).last)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from rocm_yolo import ownership; "
                               f"ownership.acquire({str(run)!r}); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in run.rglob("*"))
        with pytest.raises(UsageError, match=f"in use by another rocm-yolo supervisor \\(pid {holder.pid}\\)"):
            launch.make_spec(resume=str(last))
        with pytest.raises(UsageError, match="in use"):
            ownership.acquire(run)
        assert sorted(p.name for p in run.rglob("*")) == before  # nothing touched
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert RunPaths(run).lock.read_text().strip() == str(holder.pid)  # the stale file stays; it is no lock
    spec = launch.make_spec(resume=str(last))
    assert ownership.held(spec.run_dir)
    ownership.release(spec.run_dir)


def test_helper_children_die_with_their_parent(tmp_path):
    code = ("import sys, time; from rocm_yolo import proctree; "
            "c = proctree.start(['sleep', '120']); print(c.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proctree.alive(child):
        time.sleep(0.1)
    assert not proctree.alive(child)


# --------------------------------------------------------------------------- end to end


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
    assert read_state(paths.run_dir)["state"] == "setup_failed"
    doc = cli.run("doctor", str(tiny_data), "--skip", "kernel,shm,start", "--json", env=env, timeout=120)
    report = json.loads(doc.stdout[doc.stdout.index("{"):])
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
    assert read_state(paths.run_dir)["state"] == "internal_error" and cli.leftovers() == []


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int):
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True,
                       text=True)
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
    # last.pt fits and best.pt does not.
    with small_tmpfs(tmp_path / "disk", 32) as disk:
        paths = RunPaths(disk / "runs" / "train")
        r = cli.run("train", str(tiny_data), "--epochs", "3", "--workers", "1", "--project", str(disk / "runs"), *TINY)
        line = one_error_line(r.stdout, r.returncode, errors.SETUP, "environment error")
        assert "no space left on device" in line and "restart" not in r.stdout
        assert f"removed {paths.best}: its save was cut short" in r.stdout  # a truncated file is no checkpoint
        assert checkpoints.verify(paths.last) is None and f"the last loadable checkpoint is {paths.last}" in r.stdout
        assert "Traceback" in paths.setup_error(1).read_text() and read_state(paths.run_dir)["state"] == "setup_failed"
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


def test_a_heartbeat_file_that_cannot_be_written_is_said_once_and_still_heard(tmp_path):
    from rocm_yolo.heartbeat import HeartbeatWriter, PipeReader

    read_end, write_end = os.pipe()
    said = []
    writer = HeartbeatWriter(tmp_path / "missing" / "heartbeat.json", pipe_fd=write_end, on_error=said.append,
                             clock=lambda: 0.0)  # no second passes: only the forced records
    reader = PipeReader(read_end)
    trainer = type("T", (), {"epoch": 0, "epochs": 1, "train_loader": [None] * 3})()
    writer.on_train_epoch_start(trainer)
    for _ in range(3):
        writer.on_train_batch_end(trainer)
    writer.on_train_end(trainer)
    beats = reader.read()
    assert [hb.phase for hb in beats] == ["setup", "train", "train", "done"]  # the first batch forced, then ≤1/s
    assert [hb.seq for hb in beats] == sorted({hb.seq for hb in beats}), "every record, in order"
    hb = beats[-1]
    assert hb.batches_total == 3 and hb.seq == writer.seq and reader.read() == []
    assert len(said) == 1 and "cannot write the heartbeat file" in said[0]
    os.close(write_end)
    reader.close()
