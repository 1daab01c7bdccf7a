"""The loop acts on the cause: scripted children fail with a class's evidence, and the next attempt (or the end of
the run) is that class's remedy. Evidence on disk (a crash's traceback) is written where the child would write it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from fakes import Clock, ScriptedChild, beat, supervise
from rocm_yolo import errors
from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.gpu.release import Release
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import read_state
from rocm_yolo.supervisor.config import WatchdogConfig

CONFIG = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=3, poll_interval=1)
HSA = (
    "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000. "
    "Reason: Page not present or supervisor privilege.\n"
)


def at(clock, epoch=2, batch=3, **kw):
    """A child heard at ``epoch``, ``batch`` (its first heartbeat at t+5), then failing at t+8 as ``kw`` says."""
    kw.setdefault("exit_at", clock.now + 8)
    return ScriptedChild(clock, {clock.now + 5: beat(1, epoch=epoch, batch=batch, batches_total=1)}, **kw)


def healthy(clock):
    return ScriptedChild(clock, {clock.now + 5: beat(1)}, exit_at=clock.now + 10)


class Children:
    """Children made on demand (each starts at the clock's time when it is made)."""

    def __init__(self, clock, *makers):
        self.clock, self.makers, self.made = clock, list(makers), []

    def __getitem__(self, i):
        child = self.makers[i](self.clock)
        self.made.append(child)
        return child


def test_a_gpu_fault_restarts_on_the_same_profile_once_the_gpu_is_released(spec):
    clock, waited = Clock(), []

    def gpu_wait(pids, machine):
        waited.append(list(pids))
        return Release(True, 1.5)

    children = Children(clock, lambda c: at(c, code=-6, stderr=f"noise\n{HSA}"), healthy)
    result, made = supervise(spec, children, clock, CONFIG, gpu_wait=gpu_wait)
    assert result.exit_code == errors.OK and [s.profile for s in made] == ["fast", "fast"]
    assert waited == [[100]]  # the failed attempt's processes, before the restart
    [failure] = result.failures
    assert (failure.cls, failure.epoch, failure.batch, failure.remedy) == ("gpu-fault", 2, 3, "same")
    report = Path(spec.run_dir) / "crash-1.txt"
    assert failure.report == str(report) and "class: gpu-fault" in report.read_text() and HSA in report.read_text()
    assert read_state(spec.run_dir).recoveries[0].failure == "gpu-fault"


def test_a_second_gpu_fault_ends_with_exit_4_and_a_verdict(spec):
    clock = Clock()
    children = Children(clock, *[lambda c: at(c, code=-6, stderr=HSA)] * 2, healthy)
    result, made = supervise(spec, children, clock, CONFIG, gpu_wait=lambda pids, m: Release(True, 0.0))
    assert result.exit_code == errors.SETUP == 4 and len(made) == 2 and made[1].profile == "fast"
    assert result.verdict[0] == "the same failure twice at epoch 2, batch 3: not retrying"
    state = read_state(spec.run_dir)
    assert state.state == "failed" and state.verdict == result.verdict and len(state.failures) == 2


def test_the_same_training_error_twice_at_the_same_batch_stops_with_restarts_left(spec):
    clock = Clock()
    for attempt in (1, 2):  # what the child writes: its traceback
        crash = Path(spec.run_dir) / f"crash-{attempt}.txt"
        crash.parent.mkdir(parents=True, exist_ok=True)
        crash.write_text('Traceback (most recent call last):\n  File "x.py", line 1, in f\nRuntimeError: boom\n')
    children = Children(clock, *[lambda c: at(c, code=1)] * 6)
    result, made = supervise(spec, children, clock, replace(CONFIG, max_restarts=5))
    assert result.exit_code == errors.SAME_FAILURE and len(made) == 2 and result.restarts == 1
    assert [s.profile for s in made] == ["fast", "fast"]  # not the loader's: no step down the ladder
    assert result.verdict == ["the same failure twice at epoch 2, batch 3: not retrying"]


def test_a_collective_hang_retries_with_p2p_off_and_keeps_it_down_the_ladder(tmp_path):
    r = resolve("fast", 2, cpu_count=4)
    spec = RunSpec("d.yaml", "m.yaml", str(tmp_path / "run"), "fast", r.loader, r.val, {"epochs": 3, "device": "0,1"})
    # two GPUs: both ranks wait in the all-reduce
    frames = '  File "/x/torch/distributed/distributed_c10d.py", line 1 in all_reduce\n'
    main = '  File "/x/rocm_yolo/trainer/__main__.py", line 1 in <module>\n'
    stacks = "".join(
        f"===== pid {pid} (rank, sleeping): python\nCurrent thread 0x1 (most recent call first):\n{frames}{main}"
        for pid in (10, 11)
    )
    clock = Clock()

    def hung(c):
        return ScriptedChild(c, {c.now + 5: beat(1, batches_total=1)}, stacks=stacks)

    def dead_worker(c):
        crash = Path(spec.run_dir) / "crash-2.txt"
        crash.write_text("RuntimeError: DataLoader worker (pid 77) exited unexpectedly\n")
        return at(c, code=1)

    children = Children(clock, hung, dead_worker, healthy)
    result, made = supervise(spec, children, clock, CONFIG)
    assert result.exit_code == errors.OK and [f.cls for f in result.failures] == ["collective", "loader"]
    assert made[1].profile == "fast" and made[1].env["NCCL_P2P_DISABLE"] == "1"
    assert made[2].profile == "safe" and made[2].env["NCCL_P2P_DISABLE"] == "1"  # the ladder keeps the remedy


def test_gpu_out_of_memory_is_not_retried(spec):
    clock = Clock()
    crash = Path(spec.run_dir) / "crash-1.txt"
    crash.parent.mkdir(parents=True)
    crash.write_text("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 20.00 MiB.\n")
    spec = replace(spec, train_args={**spec.train_args, "batch": 16, "imgsz": 640})
    result, made = supervise(spec, Children(clock, lambda c: at(c, code=1), healthy), clock, CONFIG)
    assert result.exit_code == errors.SETUP and len(made) == 1 and result.restarts == 0
    assert result.verdict[0].startswith("GPU out of memory at batch 16, imgsz 640: not retrying the same batch; try")


def test_the_notify_command_hears_each_event_in_order_and_none_outlives_the_run(spec, tmp_path):
    heard = tmp_path / "heard.jsonl"
    config = replace(CONFIG, notify=f"cat >> {heard}")
    clock = Clock()
    result, _ = supervise(spec, Children(clock, lambda c: at(c, code=-6, stderr=HSA), healthy), clock, config)
    assert result.exit_code == errors.OK
    events = [json.loads(line) for line in heard.read_text().splitlines()]
    assert [e["event"] for e in events] == ["started", "crash", "restart", "finished"]
    assert all({"event", "run", "attempt", "profile", "time"} <= set(e) for e in events)
    crash = events[1]
    assert crash["class"] == "gpu-fault" and (crash["epoch"], crash["batch"], crash["exit_code"]) == (2, 3, -6)
    assert crash["run"] == str(Path(spec.run_dir).resolve()) and "GPU memory access fault" in crash["message"]
    assert events[2]["attempt"] == 2 and events[3]["exit_code"] == 0


def test_the_traceback_read_on_several_gpus_is_the_one_of_the_rank_that_failed_first(tmp_path):
    from rocm_yolo.diagnosis.evidence import launcher_report, tracebacks
    from rocm_yolo.run.paths import RunPaths

    paths = RunPaths(tmp_path)
    paths.crash(1).write_text("RuntimeError: Connection closed by peer\n")  # rank 0's, a consequence
    paths.crash(1, 1).write_text("ValueError: the real one\n")
    assert tracebacks(paths, 1, first_rank=1).rstrip().endswith("ValueError: the real one")
    assert tracebacks(paths, 1, first_rank=0).rstrip().endswith("Connection closed by peer")
    paths.state.mkdir()
    paths.torchrun_log.write_text(
        "2020-01-01 00:00:00,000 ERROR x: an older attempt's\nRoot Cause\n"
        "2099-01-01 00:00:00,000 ERROR x: this attempt's\nRoot Cause (first observed failure):\n"
    )
    report = launcher_report(paths.torchrun_log, since=1_700_000_000.0)
    assert "older" not in report and report.endswith("Root Cause (first observed failure):")


def test_a_stopped_run_tells_the_notify_command_it_stopped(spec, tmp_path):
    from rocm_yolo.process.output import RunLog
    from rocm_yolo.supervisor.loop import Supervisor

    heard = tmp_path / "heard.jsonl"
    clock = Clock()
    child = ScriptedChild(clock, {1: beat(1)})
    sup = Supervisor(
        spec,
        replace(CONFIG, notify=f"cat >> {heard}"),
        child_factory=lambda s, c: child,
        clock=clock,
        sleep=lambda dt: (clock.sleep(dt), setattr(sup.signals, "interrupted", 2)),  # Ctrl-C
        log=RunLog(stream=open("/dev/null", "w")),
        machine=Machine(),
    )
    assert sup.run().exit_code == errors.INTERRUPTED
    events = [json.loads(line) for line in heard.read_text().splitlines()]
    assert [e["event"] for e in events] == ["started", "stopped"] and events[1]["exit_code"] == 130


def test_an_index_error_has_the_labels_checked_and_one_out_of_range_makes_it_a_data_error(tmp_path):
    """Issue 44: the labels of the split the attempt was in, checked against nc after an index error; the label
    file and line are named, and the remedy is a data error's (the same profile)."""
    from rocm_yolo.request.demo import write_demo

    data = write_demo(tmp_path / "demo", train=4, val=2, size=32)
    label = sorted((data.parent / "labels" / "train").glob("*.txt"))[1]
    label.write_text(label.read_text() + "5 0.5 0.5 0.1 0.1\n")
    r = resolve("fast", 2, cpu_count=4)
    spec = RunSpec(str(data), "yolo26n.yaml", str(tmp_path / "run"), "fast", r.loader, r.val, {"epochs": 3})
    clock = Clock()

    def failing(c):
        spec.paths.run_dir.mkdir(parents=True, exist_ok=True)
        spec.paths.crash(1).write_text(  # as the child writes it
            'Traceback (most recent call last):\n  File "/x/torch/nn/functional.py", line 9, in cross_entropy\n'
            "IndexError: Target 5 is out of bounds.\n"
        )
        return at(c, code=1)

    result, made = supervise(spec, Children(clock, failing, healthy), clock, CONFIG)
    [failure] = result.failures
    assert failure.cls == "data-error" and f"{label}:" in failure.title and "class id 5 out of range" in failure.title
    assert result.exit_code == errors.OK and made[1].profile == "fast"  # the same profile: the loader is not the cause
    report = Path(failure.report).read_text()
    assert "train label files checked against nc=3" in report
