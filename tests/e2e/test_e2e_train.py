"""End to end: real Ultralytics training on the CPU, real worker processes, real signals, real resume.

Nothing is mocked: each test starts the real CLI (or the Python API), which starts the real
training child, whose DataLoader workers are real processes. Leftovers are counted with psutil.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    HEADER_ULTRALYTICS,
    TINY,
    Cli,
    epochs_in,
    events,
    rocm_lines,
    wait_for,
)
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import GOOD_NAME, RunPaths
from rocm_yolo.ultralytics_rules.checkpoint import summary

pytestmark = pytest.mark.e2e


def workers_of(run: Path) -> list[dict]:
    path = RunPaths(run).workers
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def api_run(tmp_path_factory, tiny_data):
    """Two epochs under the fast profile with 2 workers, driven through the Python API."""
    root = tmp_path_factory.mktemp("api")
    code = (
        "import json, sys, rocm_yolo\n"
        f"r = rocm_yolo.train(data={str(tiny_data)!r}, model='yolo26n.yaml', workers=2, profile='fast', epochs=2,\n"
        f"                    imgsz=32, batch=4, device='cpu', plots=False, project={str(root / 'runs')!r},\n"
        f"                    name='api')\n"
        "print('RESULT', json.dumps({'code': r.exit_code, 'run_dir': r.run_dir, 'last': str(r.last)}))\n"
    )
    cli = Cli(root)
    env = cli.environ()
    env.pop("OMP_NUM_THREADS", None)  # as most users run it (conftest sets it): the fork server then sets its own
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout.split("RESULT", 1)[1]) if "RESULT" in proc.stdout else {}
    return {"proc": proc, "result": result, "cli": cli, "run": Path(result.get("run_dir", root / "missing"))}


def test_python_api_trains_with_forkserver_workers_on_the_cpu(api_run):
    proc, run = api_run["proc"], api_run["run"]
    assert api_run["result"].get("code") == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run == run.parent / "api" and (run / "weights" / "best.pt").is_file()
    assert checkpoints.verify(run / "weights" / "last.pt") is None
    assert epochs_in(run) == [1, 2]
    [start] = events(run, "start_method")
    assert start["method"] == "spawn" and start["torch_imported"] is False  # set before torch was imported
    trainer_pid = start["pid"]
    made = workers_of(run)
    assert len(made) == 2 and {w["start_method"] for w in made} == {"forkserver"}
    server = json.loads(RunPaths(run).forkserver().read_text())
    assert server["trainer"] == trainer_pid and server["gpu_files"] == [] and server["native_threads"] == ["python"]
    # forked from the trainer once it had imported torch and Ultralytics (the user's environment: no thread count
    # set, so the trainer itself kept numpy's BLAS from starting a pool), not a second interpreter importing them
    assert server["started"] == "fork" and events(run, "forkserver_exec") == []
    assert {w["ppid"] for w in made} == {server["pid"]} and {w["trainer"] for w in made} == {trainer_pid}
    assert {w["role"] for w in made} == {"train"}
    # Ultralytics sets workers=0 on the CPU; rocm-yolo restores the request and says so
    assert "restored the requested workers=2" in proc.stderr
    assert "train loader: workers=2 start=forkserver persistent=true prefetch=4" in proc.stderr
    # persistent workers: the same processes serve epoch 1 and epoch 2
    per_epoch = {e["epoch"]: e["pids"] for e in events(run, "workers")}
    assert per_epoch[1] == per_epoch[2] and sorted(per_epoch[1]) == sorted(w["pid"] for w in made)
    assert api_run["cli"].leftovers() == []


def test_resuming_a_finished_run_says_so_and_touches_nothing(api_run, tmp_path):
    run = api_run["run"]
    last = run / "weights" / "last.pt"
    before = last.read_bytes()
    r = Cli(tmp_path).run("train", "--resume", str(last), timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    assert "has already finished all 2 epochs: train it further with rocm-yolo train --resume" in r.stdout
    assert "Traceback" not in r.stdout and last.read_bytes() == before


def test_safe_profile_gives_fresh_workers_every_epoch(cli, tiny_data, tmp_path):
    r = cli.run("train", str(tiny_data), "--profile", "safe", "--workers", "4", "--epochs", "2", *TINY)
    assert r.returncode == 0, r.stdout[-3000:]
    run = tmp_path / "runs" / "detect" / "train"
    per_epoch = {e["epoch"]: set(e["pids"]) for e in events(run, "workers")}
    assert len(per_epoch[1]) == 2 and len(per_epoch[2]) == 2
    assert per_epoch[1].isdisjoint(per_epoch[2])  # workers really replaced
    assert len(workers_of(run)) == 4 and {w["start_method"] for w in workers_of(run)} == {"forkserver"}
    assert "persistent=false prefetch=2 pin_memory=false timeout=300" in r.stdout
    assert cli.leftovers() == []


@pytest.mark.quick
@pytest.mark.lowerbound
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130)])
def test_interrupt_stops_everything_then_resume_on_a_safer_profile(cli, tiny_data, tmp_path, sig, code):
    run = tmp_path / "runs" / "detect" / "train"
    weights = run / "weights"
    proc = cli.start("train", str(tiny_data), "--workers", "2", "--epochs", "4", *TINY)
    wait_for(lambda: (weights / GOOD_NAME).exists(), 180, "the first verified checkpoint", proc, cli)
    t0 = time.monotonic()
    proc.send_signal(sig)
    time.sleep(0.3)
    proc.send_signal(sig)  # two quick Ctrl-C: still one clean stop, no tracebacks from dying workers
    proc.wait(timeout=30)
    out = cli.read()
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out and "killed by signal" not in out, out[-3000:]
    assert time.monotonic() - t0 < 15
    assert cli.leftovers() == []
    assert checkpoints.verify(weights / "last.pt") is None  # intact
    assert f"resume with: rocm-yolo train --resume {weights / 'last.pt'}" in out
    done = epochs_in(run)
    assert done and done == list(range(1, len(done) + 1)) and len(done) < 4
    # status: where the run was last heard, and what a resume starts from (last.pt's epochs, not the heartbeat's)
    status = cli.run("status", str(run), timeout=60).stdout
    beat = heartbeat.read(RunPaths(run).heartbeat)
    assert f"progress:  epoch {beat.epoch}/4, {beat.phase} batch {beat.batch}/{beat.batches}" in status
    assert f"resume:    from the start of epoch {summary(weights / 'last.pt').epoch + 2}/4 (weights/last.pt)" in status

    # A truncated last.pt (a kill in the middle of a write that is not atomic): resume must not lose the run. Since
    # every save replaces last.pt (and last_good.pt is the same file, a hard link), it is a new file in its place.
    good = summary(weights / GOOD_NAME).epoch + 1  # the epochs the verified copy holds (results.csv may hold more)
    data = (weights / "last.pt").read_bytes()
    (weights / "cut.pt").write_bytes(data[: len(data) // 2])
    os.replace(weights / "cut.pt", weights / "last.pt")
    r = cli.run("train", "--resume", str(weights / "last.pt"), "--profile", "single")
    assert r.returncode == 0, r.stdout[-3000:]
    text = "\n".join(rocm_lines(r.stdout))
    assert "resuming from the verified copy" in text and (weights / "last.truncated.pt").exists()
    assert "resume changes the profile: fast -> single" in text
    assert "changed: workers 2 -> 0" in text
    assert "loaders: workers=0 (in the main process)" in text
    assert epochs_in(run) == [1, 2, 3, 4]  # continuous, the same run directory
    assert ("done: epoch 4 " if good == 3 else f"done: epochs {good + 1}-4 ") in r.stdout  # this run's epochs
    assert "| device cpu |" in text  # the device the run was trained on, as Ultralytics' resume takes it
    assert cli.leftovers() == []


@pytest.mark.lowerbound
def test_the_readme_first_command(tmp_path):
    """`rocm-yolo train demo --epochs 2 --device cpu`, exactly as the README gives it."""
    cli = Cli(tmp_path)
    cli.env["ROCM_YOLO_DEMO_DIR"] = str(tmp_path / "demo")
    r = cli.run("train", "demo", "--epochs", "2", "--device", "cpu", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    run = tmp_path / "runs" / "detect" / "train"
    assert (run / "weights" / "last.pt").is_file() and (run / "weights" / "best.pt").is_file()
    assert not (run / "weights" / GOOD_NAME).exists()  # a finished run keeps last.pt and best.pt alone (issue 43)
    assert (tmp_path / "demo" / "demo.yaml").is_file()
    assert "profile fast | start method forkserver (preloaded)" in r.stdout
    # the workers' fork server imported the trainer's Ultralytics (in the lower-bound run, Cli checks that one)
    server = json.loads(RunPaths(run).forkserver().read_text())
    assert [server["ultralytics"]] == HEADER_ULTRALYTICS.findall(r.stdout)
    assert cli.leftovers() == []
    s = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert s.returncode == 0 and "state:     finished" in s.stdout and "done after epoch 2/2" in s.stdout
    assert "scores (P, R, mAP) stay near 0" in r.stdout and "rocm-yolo train --resume" in r.stdout  # what next


def test_supervisor_killed_with_sigkill_leaves_no_process(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    proc = cli.start("train", str(tiny_data), "--workers", "2", "--epochs", "300", *TINY)
    beat = RunPaths(run).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "batches_total", 0) > 0, 180, "training", proc, cli)
    assert len(cli.leftovers(settle=0)) >= 4  # the CLI, the trainer, 2 workers (and the resource tracker)
    status = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert (
        status.returncode == 0 and "state:     running" in status.stdout
    )  # 4 batches an epoch: it may be validating or saving
    assert re.search(r"epoch \d+/300, \w+ batch", status.stdout), status.stdout
    proc.kill()  # SIGKILL: the supervisor gets no chance to clean up
    proc.wait()
    assert cli.leftovers(settle=20) == []  # the trainer dies with its parent, the workers with the trainer


def test_gfx1010_presets_and_a_conv_strategy_in_a_real_run(cli, tiny_data, tmp_path):
    """A fake gfx1010 topology: the presets apply where the user set nothing, and are listed."""
    nodes = tmp_path / "kfd" / "nodes"
    for index, version in ((0, 0), (1, 100100)):  # a CPU node and an RX 5700
        (nodes / str(index)).mkdir(parents=True)
        (nodes / str(index) / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
    env = {"ROCM_YOLO_KFD_ROOT": str(nodes), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = cli.run(
        "train",
        str(tiny_data),
        "--epochs",
        "1",
        "--workers",
        "1",
        "--conv",
        "aten",
        "channels_last=False",
        *TINY,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    text = "\n".join(rocm_lines(r.stdout))
    assert "GPU architecture: gfx1010" in text and "conv: aten (requested)" in text
    assert re.search(r"arg\s+amp=False\s+preset: fp16 is broken", text)
    assert re.search(r"arg\s+channels_last\s+user-set, kept", text)
    assert re.search(r"tool\s+conv\s+user-set, kept", text)
    assert re.search(r"env\s+MIOPEN_FIND_MODE=FAST\s+preset:", text)
    assert (tmp_path / "cache" / "rocm-yolo" / "miopen" / "gfx1010" / "db").is_dir()
    run = tmp_path / "runs" / "detect" / "train"
    args = (run / "args.yaml").read_text()
    assert "amp: false" in args  # the preset reached Ultralytics
    # saved under the conv patch, the checkpoint loads where rocm_yolo cannot be imported
    code = (
        "import sys; sys.modules['rocm_yolo'] = None\n"
        "from ultralytics import YOLO\n"
        f"m = YOLO({str(run / 'weights' / 'best.pt')!r}); print('CLASSES', len(m.names))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "CLASSES 3" in out.stdout, out.stderr[-2000:]
    assert cli.leftovers() == []


def test_bad_data_is_a_one_line_error_and_not_retried(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"path: {tmp_path / 'nowhere'}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n")
    r = cli.run("train", str(bad), "--epochs", "1", *TINY, timeout=120)
    assert r.returncode == 2, r.stdout[-3000:]
    [error] = [line for line in rocm_lines(r.stdout) if "error:" in line]
    assert "train: " in error and "nowhere/images/train not found" in error and "Traceback" not in r.stdout
    assert "restart" not in r.stdout and cli.leftovers() == []
