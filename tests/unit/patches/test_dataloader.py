"""The DataLoader patch: what each loader gets, idempotence, exact uninstall, real workers (spawn, fork server)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from rocm_yolo.patches.loaders import dataloader as patch
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.run.paths import RunPaths

ORIGINAL = DataLoader.__dict__["__init__"]


DATA = TensorDataset(torch.arange(16, dtype=torch.float32))


@pytest.fixture
def installed(tmp_path):
    yield lambda settings, run_dir=None: patch.install(settings, run_dir)
    patch.uninstall()
    assert DataLoader.__dict__["__init__"] is ORIGINAL


def test_install_is_idempotent_and_uninstall_restores_exactly(installed):
    fast = resolve("fast", 2, cpu_count=4).loader
    installed(fast)
    patched = DataLoader.__dict__["__init__"]
    assert patched is not ORIGINAL and patch.installed()
    installed(fast)
    assert DataLoader.__dict__["__init__"] is patched  # not wrapped twice
    safe = resolve("safe", 2, cpu_count=4).loader
    installed(safe)  # a second install only changes the settings
    assert patch.settings() == safe and DataLoader.__dict__["__init__"] is patched
    patch.uninstall()
    assert DataLoader.__dict__["__init__"] is ORIGINAL and not patch.installed()
    patch.uninstall()  # a no-op


def test_the_runs_own_loaders_get_the_profile_over_ultralytics_own_choices(installed):
    installed(resolve("safe", 2, {"timeout": 30}, cpu_count=4).loader)
    with patch.loader_role("train"):
        dl = DataLoader(DATA, batch_size=4, num_workers=2, prefetch_factor=8, persistent_workers=True, pin_memory=True)
    assert dl.multiprocessing_context.get_start_method() == "forkserver"
    assert (dl.persistent_workers, dl.prefetch_factor, dl.pin_memory, dl.timeout) == (False, 2, False, 30)
    assert isinstance(dl.worker_init_fn, patch.WorkerInit)
    assert "(the profile's settings, over Ultralytics' own)" in patch.describe(patch.built_loaders()[-1])


def test_any_other_loader_keeps_what_its_caller_passed_and_gets_the_profile_only_as_defaults(installed):
    installed(resolve("fast", 2, {"timeout": 30, "prefetch_factor": 3}, cpu_count=4).loader)  # fast: persistent
    mine = DataLoader(DATA, batch_size=4, num_workers=2, prefetch_factor=8, pin_memory=False, timeout=1)
    assert (mine.persistent_workers, mine.prefetch_factor, mine.pin_memory, mine.timeout) == (False, 8, False, 1)
    bare = DataLoader(DATA, batch_size=4, num_workers=2)
    assert not bare.persistent_workers  # never forced: torch's fresh workers every epoch hold
    assert (bare.prefetch_factor, bare.timeout) == (3, 30)  # what the caller left out
    assert bare.multiprocessing_context.get_start_method() == "forkserver"
    asked = DataLoader(DATA, batch_size=4, num_workers=2, persistent_workers=True)
    assert asked.persistent_workers
    assert "profile" not in patch.describe(patch.built_loaders()[-1])


def test_positional_arguments_and_a_loaders_own_context_are_respected(installed):
    installed(resolve("fast", 2, cpu_count=4).loader)
    dl = DataLoader(DATA, 4, False, None, None, 2, multiprocessing_context="spawn")
    assert dl.num_workers == 2 and dl.multiprocessing_context.get_start_method() == "spawn"
    installed(resolve("fast", 2, {"start_method": "fork"}, cpu_count=4).loader)  # the profile's: a default only
    dl = DataLoader(DATA, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    assert dl.multiprocessing_context.get_start_method() == "spawn"
    assert DataLoader(DATA, batch_size=4, num_workers=2).multiprocessing_context.get_start_method() == "fork"


def test_invalid_ctor_args_combinations_are_refused_as_torch_refuses_them(installed):
    """Follows torch's test_invalid_ctor_args_combinations: the patch drops none of them."""
    cases = (
        {"num_workers": 0, "multiprocessing_context": "spawn"},
        {"num_workers": 0, "prefetch_factor": 2},
        {"num_workers": 0, "persistent_workers": True},
        {"num_workers": -1},
        {"num_workers": 2, "multiprocessing_context": object()},
        {"num_workers": 2, "multiprocessing_context": "no-such-method"},
    )

    def refusals() -> list:
        found = []
        for kwargs in cases:
            try:
                DataLoader(DATA, **kwargs)
                found.append(None)
            except Exception as e:  # noqa: BLE001 - whatever torch raises, the patched loader must raise the same
                found.append(type(e))
        return found

    plain = refusals()
    assert None not in plain  # torch refuses every one
    installed(resolve("fast", 2, cpu_count=4).loader)
    assert refusals() == plain
    assert patch.built_loaders() == []  # a refused loader is not in the run log


def test_zero_workers_are_left_as_torch_has_them(installed):
    installed(resolve("fast", 2, cpu_count=4).loader)
    dl = DataLoader(DATA, batch_size=4, num_workers=0)
    assert dl.multiprocessing_context is None and dl.prefetch_factor is None and not dl.persistent_workers
    assert [b[0].tolist() for b in dl][0] == [0.0, 1.0, 2.0, 3.0]


def test_validation_role_is_capped(installed):
    installed(resolve("safe", 2, {"val_workers": 1}, cpu_count=4).loader)
    with patch.loader_role("val"):
        dl = DataLoader(DATA, batch_size=4, num_workers=4)
    assert dl.num_workers == 1
    entry = patch.built_loaders()[-1]
    assert entry["role"] == "val" and entry["requested_workers"] == 4 and entry["workers"] == 1
    assert "val loader: workers=1 (requested 4) start=forkserver" in patch.describe(entry)


def test_ultralytics_infinite_loader_is_patched_too(installed):
    from ultralytics.data.build import InfiniteDataLoader

    installed(resolve("fast", 2, {"prefetch_factor": 3}, cpu_count=4).loader)
    with patch.loader_role("train"):
        dl = InfiniteDataLoader(DATA, batch_size=4, num_workers=2, prefetch_factor=4)
    assert dl.multiprocessing_context.get_start_method() == "forkserver" and dl.prefetch_factor == 3


def test_real_spawn_workers_load_and_record_themselves(installed, tmp_path):
    installed(resolve("fast", 2, {"start_method": "spawn"}, cpu_count=4).loader, tmp_path)
    dl = DataLoader(DATA, batch_size=4, num_workers=2)
    assert sorted(x for b in dl for x in b[0].tolist()) == list(map(float, range(16)))
    records = [json.loads(line) for line in RunPaths(tmp_path).workers.read_text().splitlines()]
    assert len(records) == 2 and {r["start_method"] for r in records} == {"spawn"}
    assert all(r["ppid"] == os.getpid() for r in records)


def test_workers_fork_from_a_preloaded_server_that_holds_no_gpu_and_runs_no_thread(installed, tmp_path):
    import multiprocessing.forkserver

    from rocm_yolo.trainer.forkserver import server as forkserver

    multiprocessing.forkserver._forkserver._stop()  # a server another test of this process started has no preload
    forkserver.start(tmp_path)  # as the training child does (this test process stands in for the trainer)
    installed(resolve("fast", 2, cpu_count=4).loader, tmp_path)
    dl = DataLoader(DATA, batch_size=4, num_workers=2)
    assert sorted(x for b in dl for x in b[0].tolist()) == list(map(float, range(16)))
    server = json.loads(RunPaths(tmp_path).forkserver().read_text())
    assert server["pid"] == forkserver.server_pid() and server["trainer"] == os.getpid()
    assert server["gpu_files"] == [] and server["native_threads"] == ["python"]  # nothing to inherit
    assert server["preload_error"] is None  # torch and Ultralytics really preloaded
    records = [json.loads(line) for line in RunPaths(tmp_path).workers.read_text().splitlines()]
    assert len(records) == 2 and {r["start_method"] for r in records} == {"forkserver"}
    assert {r["ppid"] for r in records} == {server["pid"]} and {r["trainer"] for r in records} == {os.getpid()}
    assert len(list(RunPaths(tmp_path).stacks.glob("worker-*.txt"))) == 2
