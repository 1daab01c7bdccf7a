"""Waiting until a killed run lets the GPU go, on fake KFD and DRM trees (the KFD process list, VRAM use)."""

from __future__ import annotations

import shutil

from fakes import Clock
from rocm_yolo.gpu.arch import GpuNode
from rocm_yolo.gpu.release import kfd_pids, vram, vram_free, wait_released

GIB = 1 << 30
GPU = GpuNode(node=1, gfx_target_version=100100, arch="gfx1010", drm_render_minor=128)


def trees(tmp_path, holders: list[int], used: int, total: int = 8 * GIB):
    kfd = tmp_path / "kfd" / "proc"
    kfd.mkdir(parents=True)
    for pid in holders:
        (kfd / str(pid)).mkdir()
        (kfd / str(pid) / "vram_52178").write_text("1024\n")
    device = tmp_path / "drm" / "renderD128" / "device"
    device.mkdir(parents=True)
    (device / "mem_info_vram_used").write_text(f"{used}\n")
    (device / "mem_info_vram_total").write_text(f"{total}\n")
    return kfd, tmp_path / "drm", device


def test_it_waits_for_the_runs_processes_to_leave_the_kfd_list_and_the_vram_to_come_back(tmp_path):
    kfd, drm, device = trees(tmp_path, holders=[4242, 999], used=6 * GIB)
    assert kfd_pids(kfd) == {4242, 999} and vram([GPU], drm) == {1: (6 * GIB, 8 * GIB)}
    assert vram_free([GPU], drm) == 2 * GIB
    clock = Clock()

    def sleep(dt):
        clock.sleep(dt)
        if clock.now >= 3:  # the driver lets the process go
            shutil.rmtree(kfd / "4242", ignore_errors=True)
        if clock.now >= 5:
            (device / "mem_info_vram_used").write_text(f"{GIB + 10}\n")

    found = wait_released([4242, 4251], [GPU], {1: GIB}, kfd_root=kfd, drm=drm, clock=clock, sleep=sleep)
    assert found.released and found.seconds == 5.0  # 999 is another user's: not waited for
    assert found.describe() == "the GPU was released after 5.0 s"


def test_it_gives_up_after_the_timeout_and_says_what_still_holds_the_gpu(tmp_path):
    kfd, drm, _ = trees(tmp_path, holders=[4242], used=6 * GIB)
    clock = Clock()
    found = wait_released([4242], [GPU], {1: GIB}, 50, kfd_root=kfd, drm=drm, clock=clock, sleep=clock.sleep)
    assert not found.released and found.seconds == 50.0 and found.holders == [4242] and found.over == {1: 5 * GIB}
    assert "pid(s) 4242" in found.describe() and "5.0 GiB above" in found.describe()
    assert found.describe().endswith("restarting anyway")


def test_without_a_kfd_there_is_nothing_to_wait_for(tmp_path):
    found = wait_released([1], [GPU], None, kfd_root=tmp_path / "none", drm=tmp_path / "none")
    assert found.released and not found.checked
