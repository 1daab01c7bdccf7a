"""AMD GPUs and their architecture, read from the kernel driver's topology in sysfs, without importing torch.

The CLI and the supervisor never import torch (importing it costs seconds and, with a
broken ROCm install, can crash), so the architecture comes from the kernel driver's
topology: ``/sys/class/kfd/kfd/topology/nodes/<n>/properties`` holds
``gfx_target_version`` (``major*10000 + minor*100 + stepping``, e.g. 100100 = gfx1010,
90010 = gfx90a; 0 on CPU nodes). The root of that tree is configurable (argument, or
``$ROCM_YOLO_KFD_ROOT``) so tests can use a fake tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo import environment

KFD_ROOT = "/sys/class/kfd/kfd/topology/nodes"
AMD_VENDOR_ID = 0x1002


@dataclass(frozen=True)
class GpuNode:
    """One GPU node of the KFD topology (what ``rocminfo`` calls an agent)."""

    node: int  # index of the topology node (CPU nodes come first)
    gfx_target_version: int  # e.g. 100100
    arch: str  # e.g. "gfx1010"
    name: str | None = None  # the node's ``name`` file, e.g. "gfx1010" (may be empty)
    vendor_id: int | None = None  # 4098 (0x1002) for AMD
    device_id: int | None = None  # PCI device id, e.g. 0x731f for RX 5600/5700
    simd_count: int | None = None
    compute_units: int | None = None  # simd_count / simd_per_cu
    drm_render_minor: int | None = None  # -> /dev/dri/renderD<minor>
    location_id: int | None = (
        None  # PCI bus/device/function packed by the driver: (bus << 8) | (device << 3) | function
    )
    domain: int | None = None  # PCI domain (kernels since 5.x write it)

    @property
    def render_device(self) -> str | None:
        """The render node the GPU is opened through (permissions: the ``render`` group)."""
        return None if self.drm_render_minor is None else f"/dev/dri/renderD{self.drm_render_minor}"

    @property
    def family(self) -> str:
        """The architecture family with the stepping wildcarded: gfx1010 -> ``gfx101x``."""
        return family(self.arch)

    @property
    def pci_address(self) -> str | None:
        """``0000:03:00.0``, as the amdgpu driver's kernel log lines name the card; None if the topology has no
        ``location_id``."""
        if self.location_id is None:
            return None
        bus, slot, function = self.location_id >> 8 & 0xFF, self.location_id >> 3 & 0x1F, self.location_id & 0x7
        return f"{self.domain or 0:04x}:{bus:02x}:{slot:02x}.{function:x}"

    def describe(self) -> str:
        """``gfx1010 (node 1, device 0x731f)``: how the doctor and the run header name this GPU."""
        return f"{self.arch} (node {self.node}" + (f", device 0x{self.device_id:04x}" if self.device_id else "") + ")"


def gfx_name(version: tuple[int, int, int]) -> str:
    """(10, 1, 0) -> ``gfx1010``, (9, 0, 10) -> ``gfx90a``: minor and stepping as one hex digit each
    (the convention of ROCm's rocprofiler and LLVM's target names)."""
    major, minor, stepping = version
    return f"gfx{major}{minor:x}{stepping:x}"


def gfx_version(arch: str) -> tuple[int, int, int] | None:
    """``"gfx1010"`` -> (10, 1, 0), ``"gfx90a"`` -> (9, 0, 10) (a ``:feature`` suffix is ignored); None if malformed."""
    m = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", (arch or "").split(":")[0])
    return (int(m[1]), int(m[2], 16), int(m[3], 16)) if m else None


def parse_override(text: str | None) -> tuple[int, int, int] | None:
    """An ``HSA_OVERRIDE_GFX_VERSION`` value: ``"10.3.0"`` -> (10, 3, 0); None if malformed."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def family(arch: str) -> str:
    """The architecture family with the stepping wildcarded: gfx1010 -> ``gfx101x``."""
    return arch[:-1] + "x"


def arch_from_target_version(version: int) -> str:
    """``gfx_target_version`` -> LLVM target name: 100100 -> gfx1010, 90010 -> gfx90a.

    The driver packs major*10000 + minor*100 + stepping.
    """
    if version <= 0:
        raise ValueError(f"gfx_target_version {version} is not a GPU (0 means a CPU node)")
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    if minor > 15 or stepping > 15:
        raise ValueError(f"gfx_target_version {version} does not map to a gfx name")
    return gfx_name((major, minor, stepping))


def _read_properties(path: Path) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            props[key] = int(value.strip())
        except ValueError:
            continue
    return props


def _kfd_root(root) -> Path:
    return Path(root if root is not None else os.environ.get(environment.KFD_ROOT) or KFD_ROOT)


def detect_gpus(root=None) -> list[GpuNode]:
    """The GPU nodes of the KFD topology in node order; [] without the driver or a GPU.

    ``root`` is the ``nodes`` directory (default ``$ROCM_YOLO_KFD_ROOT`` or the real one).
    Unreadable or malformed nodes are skipped, never raised: this runs in ``doctor`` and the
    run header, where a half-working driver is exactly the case to report, not crash on.
    """
    base = _kfd_root(root)
    try:
        entries = [p for p in base.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    gpus = []
    for entry in sorted(entries, key=lambda p: int(p.name)):
        try:
            props = _read_properties(entry / "properties")
        except OSError:
            continue
        version = props.get("gfx_target_version", 0)
        if version <= 0:  # CPU node
            continue
        try:
            arch = arch_from_target_version(version)
        except ValueError:
            continue
        try:
            name = (entry / "name").read_text(errors="replace").strip() or None
        except OSError:
            name = None
        simd, per_cu = props.get("simd_count"), props.get("simd_per_cu")
        gpus.append(
            GpuNode(
                node=int(entry.name),
                gfx_target_version=version,
                arch=arch,
                name=name,
                vendor_id=props.get("vendor_id"),
                device_id=props.get("device_id"),
                simd_count=simd,
                compute_units=simd // per_cu if simd and per_cu else None,
                drm_render_minor=props.get("drm_render_minor"),
                location_id=props.get("location_id"),
                domain=props.get("domain"),
            )
        )
    return gpus


def architectures(gpus: list[GpuNode] | None) -> list[str]:
    """The distinct architectures of ``gpus``, in node order: ``["gfx1010", "gfx1030"]``."""
    return list(dict.fromkeys(g.arch for g in gpus or ()))


def detect_arch(root=None) -> str | None:
    """The first GPU's architecture (e.g. ``"gfx1010"``), or None without an AMD GPU."""
    gpus = detect_gpus(root)
    return gpus[0].arch if gpus else None
