"""``cache=ram`` with DataLoader workers, decided before anything starts (issue 22): shared, threads, or refused.

A real data set (the demo's, 16 + 8 images of 64x64) is measured; /dev/shm and whether the installed Ultralytics
shares its cache are set per test, so each branch runs on any machine.
"""

from __future__ import annotations

import pytest

from rocm_yolo.errors import UsageError
from rocm_yolo.request import ram_cache
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run.spec import LoaderSettings
from rocm_yolo.ultralytics_rules.data import cache as ucache

CACHE = 24 * 32 * 32 * 3  # 24 images of 64x64x3, resized so the long side is imgsz 32


def loader(workers=2, start="forkserver"):
    return LoaderSettings(workers, None, True, 2, None, 0.0, start_method=start)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(write_demo(tmp_path_factory.mktemp("ram") / "d", train=16, val=8, size=64))


@pytest.fixture
def shm(monkeypatch):
    def set_free(free: int | None, shares: bool = True):
        monkeypatch.setattr(ucache, "shared_memory", lambda path=ucache.SHM: None if free is None else (free, free))
        monkeypatch.setattr(ucache, "shares_ram_cache", lambda: shares)

    return set_free


def test_the_estimate_is_the_images_resized_to_imgsz(data):
    images = ucache.split_images(data, "detect")
    assert [len(split) for split in images] == [16, 8]
    found = ucache.estimate(images, 32)
    assert (found.images, found.bytes) == (24, CACHE)


def test_workers_share_the_cache_when_shm_holds_it_twice(data, shm):
    shm(2 * CACHE)
    profile, line = ram_cache.plan(data, "detect", 32, loader(), profile_given=False)
    assert profile is None and "shared with the DataLoader workers through /dev/shm" in line


@pytest.mark.parametrize("free, shares", [(2 * CACHE - 1, True), (None, True), (10 * CACHE, False)])
def test_a_copy_per_worker_turns_into_threads_unless_a_profile_was_chosen(data, shm, free, shares):
    """Too little /dev/shm, none, or an Ultralytics that copies its cache into each worker."""
    shm(free, shares)
    profile, line = ram_cache.plan(data, "detect", 32, loader(), profile_given=False)
    assert profile == "threads" and "would each get a copy of it" in line and "loading in threads" in line
    with pytest.raises(UsageError) as refused:
        ram_cache.plan(data, "detect", 32, loader(), profile_given=True)
    assert all(fix in str(refused.value) for fix in ("--shm-size=1g", "--ipc=host", "cache=disk", "--profile threads"))


@pytest.mark.parametrize("settings", [loader(workers=0), loader(start="fork")])
def test_nothing_is_copied_without_workers_or_with_fork(data, shm, settings):
    shm(0)
    assert ram_cache.plan(data, "detect", 32, settings, profile_given=True) == (None, "")


def test_a_data_set_that_cannot_be_listed_is_left_to_the_pre_flight_checks(tmp_path, shm):
    shm(0)
    assert ram_cache.plan(str(tmp_path / "missing.yaml"), "detect", 32, loader(), profile_given=True) == (None, "")
