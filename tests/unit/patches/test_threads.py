"""The ``threads`` patch, in-process: loading in threads of the trainer, no worker process at all.

The DataLoader patch with threads installs and uninstalls exactly; a marked loader loads in
order in named threads, leaves the main thread's generators alone, honours ``timeout`` and
re-raises a thread's error; and Ultralytics' own training loader gives the same batches
twice with ``seed=`` and ``deterministic=True``, and the same batches as two real fork
worker processes (the per-thread dataset copies and seeds are faithful to torch's workers).
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from rocm_yolo.patches.loaders import dataloader as patch
from rocm_yolo.patches.loaders import threads as thread_patch
from rocm_yolo.policy.profiles import resolve

THREADS = resolve("threads", None, cpu_count=2).loader  # 2 loader threads, prefetch 2


@pytest.fixture
def installed():
    yield lambda settings: patch.install(settings)
    patch.uninstall()


def test_patch_with_threads_installs_and_uninstalls_idempotently(installed):
    names = [
        (DataLoader, "__init__"),
        (DataLoader, "_get_iterator"),
        (random, "uniform"),
        (random, "choices"),
        (random, "seed"),
        (np.random, "uniform"),
        (np.random, "beta"),
        (np.random, "seed"),
    ]
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
    with patch.loader_role("train"):  # the run's own loaders load in threads; any other as its caller built it
        dl = DataLoader(Draws(), batch_size=4)
    assert dl.num_workers == 0 and dl.prefetch_factor is None and dl.timeout == 0  # what torch accepts
    assert patch.describe(patch.built_loaders()[-1]) == (
        "train loader: workers=0 threads=2 (in the trainer process) prefetch=2 pin_memory=false timeout=0"
    )
    assert type(iter(DataLoader(Draws(), batch_size=4))).__name__ == "_SingleProcessDataLoaderIter"
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
    assert names == ["rocm-yolo-train-loader-0", "rocm-yolo-train-loader-1"]
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
    with patch.loader_role("train"):
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
    with patch.loader_role("train"):
        it = iter(DataLoader(data, batch_size=2))
    assert next(it).tolist() == [0, 1] and next(it).tolist() == [2, 3]
    with pytest.raises(ValueError, match="(?s)Caught ValueError in DataLoader loader thread 0.*bad label file"):
        next(it)  # batch 2 = items 4, 5: thread 0 (round-robin, as torch assigns workers)
    it._shutdown_workers()


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
        with patch.loader_role("train"):  # as the trainer builds it: the run's loader, the profile's settings
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
