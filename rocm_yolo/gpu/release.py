"""Who holds the GPU, and waiting until a killed run has let it go: the KFD process list and each card's VRAM use.

After a GPU fault or a GPU hang, the watchdog restarts only once the GPU is released, or the new attempt meets a
GPU still busy tearing down the old one:

- the kernel driver lists every process that has the GPU open in ``/sys/class/kfd/kfd/proc/<pid>/`` (one
  directory per process, named after its pid; ``vram_<gpu_id>`` inside), and removes it only once it has
  released the process's queues and memory, after the process is gone;
- each card's ``mem_info_vram_used`` (bytes, beside ``mem_info_vram_total``) is in its PCI device's sysfs
  directory, reached through its render node: ``/sys/class/drm/renderD<minor>/device/``, the minor being the KFD
  topology's ``drm_render_minor`` (:class:`~rocm_yolo.gpu.arch.GpuNode`).

:func:`wait_released` polls both until none of the run's processes is listed and each card's VRAM use is back near
what it was before the run, for at most a bounded time (NVIDIA's resiliency extension waits up to 50 s for GPU
memory before it restarts). The roots are arguments, so tests use fake trees. Torch-free; never raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

KFD_PROC = Path("/sys/class/kfd/kfd/proc")
DRM = Path("/sys/class/drm")
DEFAULT_TIMEOUT = 50.0  # as NVIDIA's resiliency extension
SLACK_BYTES = 256 << 20  # VRAM use "back near" its level before the run: within this, or 2% of the card


def kfd_pids(root: Path = KFD_PROC) -> set[int] | None:
    """The pids the KFD lists as holding a GPU; None without a readable KFD process list (no driver, no GPU)."""
    try:
        return {int(p.name) for p in root.iterdir() if p.name.isdigit()}
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def vram(gpus: Iterable, drm: Path = DRM) -> dict[int, tuple[int, int]]:
    """Each GPU node's (VRAM used, VRAM total) in bytes, for those whose render node shows them."""
    out = {}
    for gpu in gpus:
        if gpu.drm_render_minor is None:
            continue
        device = drm / f"renderD{gpu.drm_render_minor}" / "device"
        used, total = _read_int(device / "mem_info_vram_used"), _read_int(device / "mem_info_vram_total")
        if used is not None and total:
            out[gpu.node] = (used, total)
    return out


def vram_free(gpus: Iterable, drm: Path = DRM) -> int | None:
    """The least free VRAM of ``gpus`` in bytes (None when sysfs does not say)."""
    found = vram(gpus, drm)
    return min((total - used for used, total in found.values()), default=None)


@dataclass
class Release:
    released: bool
    seconds: float
    holders: list[int] = field(default_factory=list)  # the run's pids the KFD still listed at the end
    over: dict[int, int] = field(default_factory=dict)  # node -> bytes of VRAM above the level before the run
    checked: bool = True  # False: neither the KFD process list nor the VRAM use could be read

    def describe(self) -> str:
        if not self.checked:
            return "no KFD process list or VRAM use to read: not waiting"
        if self.released:
            return f"the GPU was released after {self.seconds:.1f} s"
        parts = []
        if self.holders:
            parts.append("the KFD still lists pid(s) " + ", ".join(str(p) for p in self.holders))
        if self.over:
            parts.append(
                "VRAM use is "
                + ", ".join(
                    f"{b / 2**30:.1f} GiB above its level before the run on node {n}" for n, b in self.over.items()
                )
            )
        return "; ".join(parts) + f" after {self.seconds:.0f} s: restarting anyway"


def _over(baseline: dict[int, int], now: dict[int, tuple[int, int]]) -> dict[int, int]:
    out = {}
    for node, (used, total) in now.items():
        if node in baseline and used - baseline[node] > max(SLACK_BYTES, total // 50):
            out[node] = used - baseline[node]
    return out


def wait_released(
    pids: Iterable[int],
    gpus: Iterable,
    baseline: dict[int, int] | None,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    kfd_root: Path = KFD_PROC,
    drm: Path = DRM,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll: float = 0.5,
    cancelled: Callable[[], bool] = lambda: False,
) -> Release:
    """Wait until no pid of ``pids`` is in the KFD process list and each card's VRAM use is back within a slack
    of ``baseline`` (node -> bytes used before the run), for at most ``timeout`` seconds."""
    pids, gpus = set(pids), list(gpus)
    start = clock()
    while True:
        listed = kfd_pids(kfd_root)
        now = vram(gpus, drm)
        if listed is None and not now:
            return Release(True, 0.0, checked=False)
        holders = sorted(pids & (listed or set()))
        over = _over(baseline or {}, now)
        waited = clock() - start
        if not holders and not over:
            return Release(True, round(waited, 1))
        if waited >= timeout or cancelled():
            return Release(False, round(waited, 1), holders, over)
        sleep(poll)
