"""End to end: real hangs, kills and faults in real Ultralytics training, caught, diagnosed and remedied.

Each test makes a genuine fault (a DataLoader worker or the trainer blocking forever, a worker
killed with SIGKILL, the HSA runtime's page-fault line and an abort, a GPU out of memory, the same
error in every attempt) and checks that the supervisor notices it (a hang within the stall timeout
plus 10 s), writes the stacks (or the traceback) with its diagnosis, kills the whole tree, applies
the remedy of the failure's class (the fallback ladder for the loader only, the same profile after a
GPU fault, a stop with exit 4 or 5), tells a real notify command, and leaves no process. The kernel
log is a test's file (the seam in ``tests/seams``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import TINY, epochs_in, events, kernel_line, rocm_lines, with_kernel_log
from rocm_yolo.process import tree
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths

pytestmark = pytest.mark.e2e


STALL = 10  # --stall-timeout for these tests (the default is 180 s)


WATCH = ["--stall-timeout", str(STALL), "--startup-grace", "90", "--workers", "2", "prefetch_factor=1"]


def check_recovered(cli, r, run: Path, epochs: int, hung_at: float | None = None) -> dict:
    assert r.returncode == 0, r.stdout[-4000:]
    assert epochs_in(run) == list(range(1, epochs + 1)), "results.csv must be continuous"
    assert cli.leftovers() == []
    [restart] = events(run, "restart")
    assert restart["profile"] == "safe" and "restart 1/3 with profile 'safe'" in r.stdout
    assert checkpoints.verify(run / "weights" / "last.pt") is None
    if hung_at is not None:
        [hang] = events(run, "hang")
        assert hang["detected"] - hung_at <= STALL + 10, "detected within the stall timeout plus 10 s"
        return hang
    return restart


def notify_script(tmp_path, metrics: Path | None = None) -> tuple[str, Path]:
    """A notify command that writes the JSON it is given into a file: (the command, the file). With ``metrics``, it
    also copies that file as the K-th event finds it, to ``heard.jsonl.K.prom``."""
    script, heard = tmp_path / "notify.sh", tmp_path / "heard.jsonl"
    script.write_text('#!/bin/sh\ncat >> "$1"\n[ -z "$2" ] || cp "$2" "$1.$(wc -l < "$1" | tr -d " ").prom"\n')
    script.chmod(0o755)
    return f"{script} {heard}" + (f" {metrics}" if metrics else ""), heard


def check_events_and_metrics(run: Path, heard: Path) -> None:
    """events.jsonl in time order, with one "finished" (the trainer's record of its own end is "trained"); the final
    metrics.prom as Prometheus reads it (prometheus_client's parser; promtool where installed), its timestamps
    those of the last heartbeat and of its write, and the same restart series from the first write (as the
    "started" event found it) to the last."""
    from prometheus_client.parser import text_string_to_metric_families

    written = read_events(RunPaths(run).events)
    for pid in {e["pid"] for e in written}:  # one process's events: in order
        assert [e["time"] for e in written if e["pid"] == pid] == sorted(e["time"] for e in written if e["pid"] == pid)
    times = [e["time"] for e in written]  # two processes': a time stamp and its append may cross by microseconds
    assert all(later >= earlier - 0.05 for earlier, later in zip(times, times[1:])), written
    assert len(events(run, "finished")) == len(events(run, "trained")) == 1
    assert not [e for e in written if None in (e.get("epoch", 0), e.get("batch", 0))]

    def read(text: str) -> dict:
        return {
            (s.name, s.labels.get("class")): s.value for f in text_string_to_metric_families(text) for s in f.samples
        }

    metrics = RunPaths(run).metrics
    final, first = read(metrics.read_text()), read(Path(f"{heard}.1.prom").read_text())
    beat = json.loads(RunPaths(run).heartbeat.read_text())
    assert abs(final[("rocm_yolo_heartbeat_timestamp_seconds", None)] - beat["time"]) < 1
    assert abs(final[("rocm_yolo_metrics_timestamp_seconds", None)] - metrics.stat().st_mtime) < 1
    restarts = [{k[1]: v for k, v in found.items() if k[0] == "rocm_yolo_restarts_total"} for found in (first, final)]
    assert set(restarts[0]) == set(restarts[1]) and len(restarts[1]) == 10 and set(restarts[0].values()) == {0}
    assert restarts[1]["loader"] == 1 and sum(restarts[1].values()) == 1
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=metrics.read_text(), capture_output=True, text=True)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def stacks(run: Path) -> str:
    [path] = run.glob("hang-1-stacks.txt")
    return path.read_text()


XORG = (
    "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:6 pasid:32770, for process Xorg pid "
    "901 thread Xorg:cs0 pid 955)"
)
CHROME = "Out of memory: Killed process 99999999 (chrome) total-vm:8000kB, anon-rss:7000kB"  # no pid of this machine


@contextlib.contextmanager
def other_processes_failing(kernel: Path):
    """While the run trains, other processes fault on a card and die for memory: the kernel log says so."""
    stop = threading.Event()

    def write() -> None:
        while not stop.wait(0.5):
            with open(kernel, "a") as f:
                f.write(kernel_line(XORG) + kernel_line(CHROME))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


@pytest.mark.quick
@pytest.mark.lowerbound
def test_worker_blocking_forever_mid_run(cli, tiny_data, tmp_path):
    """A worker hang, after a GPU error the trainer handled (its words in stderr) and while other processes' page
    faults and OOM kills land in the kernel log: none of that decides the class (issue 30). A loader hang it is, and
    the run recovers down the ladder."""
    run = tmp_path / "runs" / "detect" / "train"
    notify, heard = notify_script(tmp_path, RunPaths(run).metrics)
    with other_processes_failing(with_kernel_log(cli, tmp_path)):
        r = cli.run(
            "train", str(tiny_data), "--epochs", "3", *WATCH, *TINY, "--notify", notify,
            env={"ROCM_YOLO_FAULT": "handled-hip-error@1:2,worker-hang@2:1"},
        )  # fmt: skip
    fired = RunPaths(run).fault_fired("worker-hang").stat().st_mtime
    hang = check_recovered(cli, r, run, 3, hung_at=fired)
    assert hang["epoch"] == 2 and hang["phase"] == "train" and hang["class"] == "loader" and not hang["weak"]
    assert "RuntimeError: HIP error: invalid device function" in RunPaths(run).child_stderr(1).read_text()
    dumped, report = stacks(run).split("--- rocm-yolo diagnosis:", 1)
    decided, rest = report.split("why:", 1)
    why = rest.splitlines()[0]  # the tools that read the stacks, only those (issue 43: py-spy named, never run)
    assert "faulthandler" in why and ("py-spy" in why) == ("--- py-spy dump --native (exit 0)" in dumped), why
    assert "Xorg" not in decided and "chrome" not in decided and "invalid device function" not in decided
    others = rest.split("kernel lines of other processes or cards (never this run's):", 1)[1].split("\n", 1)[0]
    assert int(others) >= 2 and "Xorg" not in report and "chrome" not in report  # counted, never quoted (issue 45)
    assert stat.S_IMODE((run / "hang-1-stacks.txt").stat().st_mode) == 0o640  # the group may read it, no one else
    told = [json.loads(line) for line in heard.read_text().splitlines()]  # a real command, the events in order
    assert [e["event"] for e in told] == ["started", "hang", "restart", "finished"]
    assert told[1]["class"] == "loader" and told[1]["epoch"] == 2 and told[2]["profile"] == "safe"
    assert told[3]["exit_code"] == 0 and {e["run"] for e in told} == {str(run)}
    assert told[2]["epoch"] == 2 and told[3]["epoch"] == 3 and hang["detected"] <= hang["time"]  # where the run was
    check_events_and_metrics(run, heard)
    assert "DataLoader hang (the trainer waits for a batch that never comes) at epoch 2/3" in r.stdout
    text = stacks(run)
    assert "class: loader" in text.split("--- rocm-yolo diagnosis:")[1]
    worker_part = text[text.index("(worker,") :]
    assert "block_forever" in worker_part and "__getitem__" in worker_part  # where the worker is stuck
    assert "_try_get_data" in text[: text.index("(worker,")]  # the trainer waits for its batch
    if tree.find_py_spy():  # installed with the test extra: native stacks too
        assert "py-spy dump --native (exit 0)" in text
    assert "from /" in r.stdout and "weights/last.pt" in events(run, "restart")[0]["resume"]


def test_trainer_blocking_forever_before_the_first_checkpoint_restarts_in_the_same_directory(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run("train", str(tiny_data), "--epochs", "2", *WATCH, *TINY, env={"ROCM_YOLO_FAULT": "main-hang@1:2"})
    fired = RunPaths(run).fault_fired("main-hang").stat().st_mtime
    hang = check_recovered(cli, r, run, 2, hung_at=fired)
    assert hang["epoch"] == 1 and hang["batch"] in (1, 2)  # as of the last heartbeat (written at most 1/s)
    trainer_part = stacks(run).split("=====")[1]
    assert "(trainer," in trainer_part and "block_forever" in trainer_part and "on_train_batch_end" in trainer_part
    assert hang["class"] == "unknown"  # blocked in a callback: no evidence of a cause, so the ladder as before
    [restart] = events(run, "restart")
    assert restart["resume"] is None and "from the start (no checkpoint yet)" in r.stdout
    assert not (tmp_path / "runs" / "detect" / "train-2").exists()


def _live_worker_in_epoch_2(run, proc) -> int:
    deadline = time.monotonic() + 180
    victim = None
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        hb = heartbeat.read(RunPaths(run).heartbeat)
        if hb and hb.epoch >= 2 and hb.phase == "train":
            records = [json.loads(x) for x in RunPaths(run).workers.read_text().splitlines()]
            alive = [w["pid"] for w in records if psutil.pid_exists(w["pid"])]
            victim = alive[0] if alive else None
        time.sleep(0.05)
    assert victim is not None, "no live worker found in epoch 2"
    return victim


def test_worker_killed_with_sigkill(cli, tiny_data, tmp_path):
    """Killed by the OOM killer, as the (fake) kernel log says: host out of memory, the victim named, and the
    ladder's next rung (safe: fewer workers) as its remedy."""
    run = tmp_path / "runs" / "detect" / "train"
    kernel = with_kernel_log(cli, tmp_path)
    proc = cli.start("train", str(tiny_data), "--epochs", "3", *WATCH, *TINY)
    victim = _live_worker_in_epoch_2(run, proc)
    killed_at = time.time()
    with open(kernel, "a") as f:
        f.write(kernel_line("usb 1-1: new device"))
        f.write(kernel_line(f"Out of memory: Killed process {victim} (python) total-vm:2000000kB, anon-rss:900000kB"))
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=240)
    out = cli.read()
    r = type("R", (), {"returncode": proc.returncode, "stdout": out})
    check_recovered(cli, r, run, 3)
    [crash] = events(run, "crash")
    assert crash["detected"] - killed_at <= STALL + 10
    [trace] = run.glob("crash-1.txt")
    assert "DataLoader worker" in trace.read_text() and str(victim) in trace.read_text()
    assert crash["class"] == "host-oom" and f"the OOM killer killed python (pid {victim})" in crash["message"]
    report = trace.read_text().split("--- rocm-yolo diagnosis:")[1]
    assert "Out of memory: Killed process" in report and "usb 1-1" not in report  # the kernel's lines that matter


def test_a_worker_killed_with_sigkill_and_no_kernel_line_is_named_with_its_signal_and_usual_sender(
    cli, tiny_data, tmp_path
):
    """Issue 27, item 3: the error names the worker's pid and signal (as torch does for its own children, also for a
    fork-server worker), and the watchdog's line says who usually sends SIGKILL and that the kernel log has no line."""
    run = tmp_path / "runs" / "detect" / "train"
    with_kernel_log(cli, tmp_path)  # readable, and no OOM-killer line in it
    proc = cli.start("train", str(tiny_data), "--epochs", "3", *WATCH, *TINY)
    victim = _live_worker_in_epoch_2(run, proc)
    os.kill(victim, signal.SIGKILL)
    proc.wait(timeout=240)
    out = cli.read()
    check_recovered(cli, type("R", (), {"returncode": proc.returncode, "stdout": out}), run, 3)
    [crash] = events(run, "crash")
    trace = (run / "crash-1.txt").read_text()
    assert f"(pid {victim})" in trace and signal.strsignal(signal.SIGKILL) in trace  # the cause torch would give
    assert crash["class"] == "loader" and str(victim) in crash["message"]
    assert "out-of-memory killer" in crash["message"] and "no OOM-killer line" in crash["message"], crash["message"]


FAULTY = [*TINY, "--epochs", "1", "--stall-timeout", str(STALL), "--startup-grace", "90"]


def test_a_gpu_fault_restarts_on_the_same_profile_and_the_second_ends_with_exit_4(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    with_kernel_log(cli, tmp_path)
    r = cli.run(
        "train", str(tiny_data), *FAULTY, "--workers", "1",
        env={"ROCM_YOLO_FAULT": "gpu-fault@1:2,gpu-fault@1:2"},
    )  # fmt: skip
    assert r.returncode == 4, r.stdout[-3000:]
    lines = rocm_lines(r.stdout)
    fault = "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000."
    assert any(fault in line for line in r.stdout.splitlines())  # the runtime's own line still reaches the terminal
    assert "rocm-yolo: training process exited with code -6 (SIGABRT) (attempt 1)" in lines
    said = (
        f"rocm-yolo: GPU memory access fault (page not present) at epoch 1/1, batch 2/4 (attempt 1); details in {run}"
    )
    assert any(line.startswith(said) for line in lines)
    assert [e["profile"] for e in events(run, "restart")] == ["fast"]  # not down the ladder
    assert any("restart 1/3 on the same profile 'fast' (gpu-fault" in line for line in lines)
    assert "rocm-yolo: the same failure twice at epoch 1, batch 2: not retrying" in lines
    assert any("ROCm/ROCm#5051" in line for line in lines)  # a known issue, with its source
    assert [e["class"] for e in events(run, "crash")] == ["gpu-fault", "gpu-fault"]
    report = (run / "crash-1.txt").read_text()
    decided = report.split("evidence (the failure's own output):", 1)[1].split("why:", 1)[0]
    assert "class: gpu-fault" in report and fault in decided  # the runtime's line decided it, as the failure's own
    assert fault in RunPaths(run).child_stderr(1).read_text()
    assert cli.leftovers() == []


def test_the_same_error_twice_at_the_same_batch_stops_and_a_notify_that_never_returns_is_killed(
    cli, tiny_data, tmp_path
):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run(
        "train", str(tiny_data), *FAULTY, "--profile", "single", "--max-restarts", "5", "--notify", "sleep 600",
        env={"ROCM_YOLO_FAULT": "same-crash@1:2"},
    )  # fmt: skip
    assert r.returncode == 5, r.stdout[-3000:]
    assert "rocm-yolo: the same failure twice at epoch 1, batch 2: not retrying" in rocm_lines(r.stdout)
    assert [p.name for p in RunPaths(run).specs()] == ["spec-1.json", "spec-2.json"]  # 4 restarts left unspent
    assert [e["class"] for e in events(run, "crash")] == ["training-error"] * 2
    [failed] = events(run, "failed")
    assert failed["exit_code"] == 5 and failed["message"].startswith("the same failure twice")
    assert len(events(run, "notify_error")) == 1  # said once
    assert cli.leftovers() == []  # the notify commands too: none outlives the run


def test_gpu_out_of_memory_is_not_retried_and_a_smaller_batch_is_suggested(cli, tiny_data, tmp_path):
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run("train", str(tiny_data), *FAULTY, "--profile", "single", env={"ROCM_YOLO_FAULT": "oom@1:1"})
    assert r.returncode == 4, r.stdout[-3000:]
    assert (
        "rocm-yolo: GPU out of memory at batch 4, imgsz 32: not retrying the same batch; try --batch 2 "
        "(or batch=-1: Ultralytics picks one from the free memory)"
    ) in rocm_lines(r.stdout)
    assert events(run, "restart") == [] and events(run, "crash")[0]["class"] == "gpu-oom"
    assert cli.leftovers() == []
