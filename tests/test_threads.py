"""The ``threads`` profile: loading in threads of the trainer process, no worker process at all.

In-process (cheap): the profile's settings; the DataLoader patch with threads installs and
uninstalls exactly; a marked loader loads in order in named threads, leaves the main thread's
generators alone, honours ``timeout`` and re-raises a thread's error; and Ultralytics' own
training loader gives the same batches twice with ``seed=`` and ``deterministic=True``, and the
same batches as two real fork worker processes (the per-thread dataset copies and seeds are
faithful to torch's workers).

End to end (one real run, shared): ``--profile threads`` trains with loader threads in the
trainer and no child process of the trainer, sampled with psutil all through the run; a
loader thread made to hang (``ROCM_YOLO_FAULT=worker-hang``) is detected by the watchdog, the
stacks show the loader threads, and the run finishes on the next rung, ``single``.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from conftest import TINY, Cli, rocm_lines
from rocm_yolo.errors import UsageError
from rocm_yolo.log import read_events
from rocm_yolo.paths import RunPaths
from rocm_yolo.patches import dataloader as patch
from rocm_yolo.patches import threads as thread_patch
from rocm_yolo.profiles import DEFAULT_LADDER, PROFILES, next_profile, resolve

THREADS = resolve("threads", None, cpu_count=2).loader  # 2 loader threads, prefetch 2


@pytest.fixture
def installed():
    yield lambda settings: patch.install(settings)
    patch.uninstall()


# --------------------------------------------------------------------------- settings


def test_threads_profile_settings_and_their_errors():
    big = resolve("threads", None, cpu_count=16)
    assert (big.loader.workers, big.loader.threads, big.loader.prefetch_factor) == (0, 8, 2)
    assert big.loader.pin_memory is None and big.loader.timeout == 0 and big.val and not big.warnings
    assert resolve("threads", None, cpu_count=2).loader.threads == 2  # capped by the CPU count
    r = resolve("threads", None, {"threads": 4, "prefetch_factor": 3, "timeout": 60}, cpu_count=16)
    assert (r.loader.threads, r.loader.prefetch_factor, r.loader.timeout) == (4, 3, 60)
    assert r.loader.describe() == "workers=0 threads=4 (in the trainer process) prefetch=3 pin_memory=auto timeout=60"
    r = resolve("threads", None, {"threads": 32}, cpu_count=16)
    assert r.loader.threads == 16 and any("threads=32 is more than the 16 CPUs" in w for w in r.warnings)
    r = resolve("threads", 4, cpu_count=16)
    assert r.loader.workers == 0 and any("workers=4 ignored (set its loader threads with threads=N)" in w
                                         for w in r.warnings)
    for profile, value, message in [("fast", 4, "add --profile threads"), ("single", 2, "add --profile threads"),
                                    ("threads", 0, "threads=0 must be >= 1"), ("threads", "two", "not an integer")]:
        with pytest.raises(UsageError, match=message):
            resolve(profile, None, {"threads": value}, cpu_count=16)
    single = resolve("single", None, cpu_count=16).loader
    assert single.threads == 0 and single.prefetch_factor is None  # single stays strictly single-threaded
    rows = {name: dict(p.rows()) for name, p in PROFILES.items()}
    assert rows["threads"]["loader threads"] == "min(8, CPUs)" and rows["threads"]["prefetch_factor"] == "2 per thread"
    assert rows["single"]["loader threads"] == "-" and rows["single"]["prefetch_factor"] == "-"
    assert DEFAULT_LADDER == ("fast", "safe", "threads", "single")
    assert [next_profile(p, DEFAULT_LADDER) for p in DEFAULT_LADDER] == ["safe", "threads", "single", "single"]


# --------------------------------------------------------------------------- the patch


def test_patch_with_threads_installs_and_uninstalls_idempotently(installed):
    names = [(DataLoader, "__init__"), (DataLoader, "_get_iterator"), (random, "uniform"), (random, "choices"),
             (random, "seed"), (np.random, "uniform"), (np.random, "beta"), (np.random, "seed")]
    original = [owner.__dict__[name] for owner, name in names]
    installed(THREADS)
    patched = [owner.__dict__[name] for owner, name in names]
    assert all(p is not o for p, o in zip(patched, original)) and thread_patch.installed()
    installed(THREADS)  # again: nothing is wrapped twice
    assert [owner.__dict__[name] for owner, name in names] == patched
    assert random.uniform.__wrapped__ is original[2] and DataLoader._get_iterator.__wrapped__ is original[1]
    patch.uninstall()
    assert all(owner.__dict__[name] is o for (owner, name), o in zip(names, original))
    assert not thread_patch.installed()
    patch.uninstall()  # a no-op


class Draws(Dataset):
    """Each item: its index, and a number drawn from the global ``random`` and ``np.random``."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor([float(i), random.random(), float(np.random.uniform())])


def test_marked_loaders_load_in_order_in_threads_and_leave_the_main_generators_alone(installed):
    plain = DataLoader(Draws(), batch_size=4)  # built before the patch: torch's own iterator
    installed(THREADS)
    dl = DataLoader(Draws(), batch_size=4)
    assert dl.num_workers == 0 and dl.prefetch_factor is None and dl.timeout == 0  # what torch accepts
    assert patch.describe(patch.built_loaders()[-1]) == (
        "other loader: workers=0 threads=2 (in the trainer process) prefetch=2 pin_memory=false timeout=0")
    assert type(iter(plain)).__name__ == "_SingleProcessDataLoaderIter"

    def one_pass():
        it = iter(dl)
        assert isinstance(it, thread_patch.ThreadedLoaderIter)
        names = sorted(t.name for t in it._workers if t.is_alive())
        batches = torch.cat(list(it))
        assert not any(t.is_alive() for t in it._workers)  # the pass ended: threads stopped and joined
        return names, batches

    random.seed(7), np.random.seed(7)
    expected = (random.random(), float(np.random.uniform()))
    random.seed(7), np.random.seed(7)
    dl.generator = torch.Generator().manual_seed(1)  # the loader's generator gives the threads' base seed
    names, first = one_pass()
    assert names == ["rocm-yolo-other-loader-0", "rocm-yolo-other-loader-1"]
    assert first[:, 0].tolist() == list(range(16))  # in order, whatever thread finished first
    assert (random.random(), float(np.random.uniform())) == expected  # the loader threads drew from their own
    dl.generator = torch.Generator().manual_seed(1)
    assert torch.equal(one_pass()[1], first)  # same base seed: same draws in every thread
    assert len(set(first[:, 1].tolist())) == 16  # and the two threads did not get the same stream


class Stuck(Dataset):
    """Items from index 4 on wait for ``release``; index 5 raises when ``fail`` is set."""

    def __init__(self):
        self.release, self.fail = threading.Event(), False

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5 and self.fail:
            raise ValueError("bad label file")
        if i >= 4:
            self.release.wait()
        return i


def test_timeout_and_errors_reach_the_trainer_like_torch_workers(installed):
    installed(resolve("threads", None, {"timeout": 1}, cpu_count=2).loader)
    data = Stuck()
    it = iter(DataLoader(data, batch_size=2))
    assert next(it).tolist() == [0, 1] and next(it).tolist() == [2, 3]
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader timed out after 1 seconds"):
        next(it)
    assert time.monotonic() - t0 < 10
    it._shutdown_workers()  # threads blocked for longer than twice their slowest batch: stuck, not waited for
    assert any(t.is_alive() for t in it._workers)
    data.release.set()  # unstuck, they stop after the batch in hand
    for t in it._workers:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in it._workers)
    data.fail = True
    it = iter(DataLoader(data, batch_size=2))
    assert next(it).tolist() == [0, 1] and next(it).tolist() == [2, 3]
    with pytest.raises(ValueError, match="(?s)Caught ValueError in DataLoader loader thread 0.*bad label file"):
        next(it)  # batch 2 = items 4, 5: thread 0 (round-robin, as torch assigns workers)
    it._shutdown_workers()


# --------------------------------------------------------------------------- Ultralytics' loader


def yolo_batches(data_yaml: Path, settings, seed: int, workers: int = 0, epochs: int = 2) -> list[str]:
    """Fingerprints (images, boxes, files) of the batches of Ultralytics' training loader under ``settings``."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils.torch_utils import init_seeds, unset_deterministic

    environ = dict(os.environ)
    patch.install(settings)
    try:
        init_seeds(seed, deterministic=True)  # what Ultralytics' trainer does with seed= and deterministic=True
        data = check_det_dataset(str(data_yaml))
        dataset = build_yolo_dataset(get_cfg(overrides={"imgsz": 64}), data["train"], 4, data, mode="train")
        loader = build_dataloader(dataset, 4, workers, shuffle=True)
        out = []
        for _ in range(epochs):
            for b in loader:
                digest = hashlib.sha1(b["img"].numpy().tobytes() + b["bboxes"].numpy().tobytes())
                out.append(digest.hexdigest()[:12] + ":" + ",".join(Path(f).stem for f in b["im_file"]))
        loader.close()
        return out
    finally:
        patch.uninstall()
        unset_deterministic()
        os.environ.clear()
        os.environ.update(environ)  # init_seeds sets PYTHONHASHSEED and CUBLAS_WORKSPACE_CONFIG


def test_thread_loading_is_reproducible_and_equals_worker_processes(tiny_data):
    first = yolo_batches(tiny_data, THREADS, seed=0)
    assert len(first) == 8 and len(set(first)) == 8  # 2 epochs x 4 mosaic batches, all different
    assert yolo_batches(tiny_data, THREADS, seed=0) == first  # run after run
    assert yolo_batches(tiny_data, THREADS, seed=1) != first  # the comparison can fail
    # Two real worker processes (fork: cheap here, no GPU) with the same seed load exactly the same batches.
    forked = resolve("fast", 2, {"start_method": "fork"}, cpu_count=2).loader
    assert yolo_batches(tiny_data, forked, seed=0, workers=2) == first


# --------------------------------------------------------------------------- end to end

STALL = 10


@pytest.fixture(scope="module")
def hung_threads_run(tmp_path_factory, tiny_data):
    """``--profile threads`` for 2 epochs; a loader thread hangs in epoch 2; psutil samples the trainer."""
    root = tmp_path_factory.mktemp("threads")
    cli = Cli(root)
    proc = cli.start("train", str(tiny_data), "--profile", "threads", "--epochs", "2", "prefetch_factor=1",
                     "--stall-timeout", str(STALL), "--startup-grace", "90", *TINY,
                     env={"ROCM_YOLO_FAULT": "worker-hang@2:1"})
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
                        (t / "comm").read_text().strip() for t in tasks.iterdir())
                except (psutil.Error, OSError):
                    continue
            time.sleep(0.05)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        cli.kill_all()
        raise
    run = root / "runs" / "detect" / "train"
    starts = [e for e in read_events(RunPaths(run).events) if e["event"] == "start_method"]
    yield {"cli": cli, "code": code, "out": cli.read(), "run": run, "children": children, "samples": samples,
           "names": thread_names, "trainers": [e["pid"] for e in starts]}
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

    started = {trainer: {pid: cmd for pid, cmd in procs.items() if may_load(pid, cmd)}
               for trainer, procs in r["children"].items()}
    assert started.get(threads_trainer) == {}, "the trainer of the threads profile started a process"
    assert all(not procs for procs in started.values())  # nor did the single one after it
    assert {"loader-train-0", "loader-train-1"} <= r["names"][threads_trainer]  # it loaded in its own threads
    assert not RunPaths(r["run"]).workers.exists()  # no DataLoader worker process ever registered
    lines = rocm_lines(r["out"])
    assert "rocm-yolo: loaders: workers=0 threads=2 (in the trainer process) prefetch=1 pin_memory=auto timeout=0" in lines
    assert ("rocm-yolo: train loader: workers=0 threads=2 (in the trainer process) prefetch=1 pin_memory=false "
            "timeout=0") in lines
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
    assert hang["epoch"] == 2 and hang["time"] - fired <= STALL + 10
    assert restart["profile"] == "single" and "restart 1/3 with profile 'single'" in r["out"]
    stacks = (r["run"] / "hang-1-stacks.txt").read_text()
    assert stacks.count("in block_forever") >= 1 and "patches/threads.py" in stacks  # the hung loader thread
    assert "in _next_data" in stacks  # and the trainer waiting for its batch
    assert len(r["trainers"]) == 2
