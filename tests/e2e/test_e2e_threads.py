"""End to end, the ``threads`` profile: one real run, shared.

``--profile threads`` trains with loader threads in the trainer and no child process of the
trainer, sampled with psutil all through the run; a loader thread made to hang
(``ROCM_YOLO_FAULT=worker-hang``) is detected by the watchdog, the stacks show the loader
threads, and the run finishes on the next rung, ``single``.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from helpers import TINY, Cli, rocm_lines
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths

STALL = 10


@pytest.fixture(scope="module")
def hung_threads_run(tmp_path_factory, tiny_data):
    """``--profile threads`` for 2 epochs; a loader thread hangs in epoch 2; psutil samples the trainer."""
    root = tmp_path_factory.mktemp("threads")
    cli = Cli(root)
    proc = cli.start(
        "train",
        str(tiny_data),
        "--profile",
        "threads",
        "--epochs",
        "2",
        "prefetch_factor=1",
        "--stall-timeout",
        str(STALL),
        "--startup-grace",
        "90",
        *TINY,
        env={"ROCM_YOLO_FAULT": "worker-hang@2:1"},
    )
    children: dict[int, dict] = {}  # trainer pid -> {pid: command line} of its descendants, over all samples
    samples: dict[int, int] = {}  # descendant pid -> in how many samples it was seen
    thread_names: dict[int, set] = {}  # trainer pid -> OS names of its threads
    deadline = time.monotonic() + 240
    try:
        cli_process = psutil.Process(proc.pid)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                trainers = cli_process.children()
            except psutil.Error:
                trainers = []
            for trainer in trainers:
                try:
                    found = children.setdefault(trainer.pid, {})
                    for c in trainer.children(recursive=True):
                        samples[c.pid] = samples.get(c.pid, 0) + 1
                        cmd = " ".join(c.cmdline())  # the latest: a fork seen before its exec has its parent's
                        if cmd or c.pid not in found:
                            found[c.pid] = cmd
                    tasks = Path(f"/proc/{trainer.pid}/task")
                    thread_names.setdefault(trainer.pid, set()).update(
                        (t / "comm").read_text().strip() for t in tasks.iterdir()
                    )
                except (psutil.Error, OSError):
                    continue
            time.sleep(0.05)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        cli.kill_all()
        raise
    run = root / "runs" / "detect" / "train"
    starts = [e for e in read_events(RunPaths(run).events) if e["event"] == "start_method"]
    yield {
        "cli": cli,
        "code": code,
        "out": cli.read(),
        "run": run,
        "children": children,
        "samples": samples,
        "names": thread_names,
        "trainers": [e["pid"] for e in starts],
    }
    cli.kill_all()


@pytest.mark.e2e
def test_threads_profile_trains_with_no_worker_process(hung_threads_run):
    r = hung_threads_run
    assert r["code"] == 0, r["out"][-4000:]
    threads_trainer = r["trainers"][0]

    # A process that could load data is a Python process that lives (a worker or a fork server: an epoch at
    # least). Not one: multiprocessing's resource tracker, which Ultralytics' label cache (a ThreadPool, under
    # the spawn start method rocm-yolo sets) starts under every profile, and the helper programs libraries run for
    # milliseconds (ldconfig -p from ctypes.util.find_library; fc-list in Ultralytics 8.4.158-8.4.170, looking
    # for Arial), which a sample may catch before their exec, under the trainer's command line.
    def may_load(pid: int, cmd: str) -> bool:
        python = not cmd or "python" in Path(cmd.split(" ", 1)[0]).name  # unreadable: suspect
        return python and r["samples"][pid] >= 3 and "multiprocessing.resource_tracker" not in cmd

    started = {
        trainer: {pid: cmd for pid, cmd in procs.items() if may_load(pid, cmd)}
        for trainer, procs in r["children"].items()
    }
    assert started.get(threads_trainer) == {}, "the trainer of the threads profile started a process"
    assert all(not procs for procs in started.values())  # nor did the single one after it
    assert {"loader-train-0", "loader-train-1"} <= r["names"][threads_trainer]  # it loaded in its own threads
    assert not RunPaths(r["run"]).workers.exists()  # no DataLoader worker process ever registered
    lines = rocm_lines(r["out"])
    assert (
        "rocm-yolo: loaders: workers=0 threads=2 (in the trainer process) prefetch=1 pin_memory=auto timeout=0" in lines
    )
    assert (
        "rocm-yolo: train loader: workers=0 threads=2 (in the trainer process) prefetch=1 pin_memory=false timeout=0"
    ) in lines
    with open(r["run"] / "results.csv") as f:
        assert [int(float(line.split(",")[0])) for line in f.read().splitlines()[1:]] == [1, 2]
    assert r["cli"].leftovers() == []


@pytest.mark.e2e
def test_a_hung_loader_thread_is_caught_and_the_run_finishes_on_single(hung_threads_run):
    r = hung_threads_run
    events = read_events(RunPaths(r["run"]).events)
    [hang] = [e for e in events if e["event"] == "hang"]
    [restart] = [e for e in events if e["event"] == "restart"]
    fired = RunPaths(r["run"]).fault_fired("worker-hang").stat().st_mtime
    assert hang["epoch"] == 2 and hang["detected"] - fired <= STALL + 10
    assert restart["profile"] == "single" and "restart 1/3 with profile 'single'" in r["out"]
    stacks = (r["run"] / "hang-1-stacks.txt").read_text()
    assert stacks.count("in block_forever") >= 1 and "patches/loaders/threads.py" in stacks  # the hung loader thread
    assert "in _next_data" in stacks  # and the trainer waiting for its batch
    assert len(r["trainers"]) == 2
