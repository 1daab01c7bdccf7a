"""AMD GPU architecture detection and per-architecture presets, without importing torch.

The CLI and the supervisor never import torch (importing it costs seconds and, with a
broken ROCm install, can crash), so the architecture comes from the kernel driver's
topology in sysfs: ``/sys/class/kfd/kfd/topology/nodes/<n>/properties`` holds
``gfx_target_version`` (``major*10000 + minor*100 + stepping``, e.g. 100100 = gfx1010,
90010 = gfx90a; 0 on CPU nodes). The root of that tree is configurable (argument, or
``$ROCM_YOLO_KFD_ROOT``) so tests can use a fake tree.

Presets are the settings a given architecture needs to train at all (gfx101x: no AMP, no
channels_last, a convolution strategy chosen by self-test, MIOpen's fast find mode on NCHW
kernels, a private MIOpen cache); docs/conv.md names the public source of each. ``presets`` is pure: it says what it would set and whether the user has
already set it; the caller applies the ones the user has not set and prints all of them.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from rocm_yolo.paths import miopen_dir

__all__ = [
    "KFD_ROOT",
    "GpuNode",
    "Preset",
    "arch_from_target_version",
    "detect_gpus",
    "detect_arch",
    "torch_build",
    "torch_view",
    "presets",
    "header_lines",
    "override_advice",
]

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
    location_id: int | None = None  # PCI bus/device/function packed by the driver

    @property
    def render_device(self) -> str | None:
        """The render node the GPU is opened through (permissions: the ``render`` group)."""
        return None if self.drm_render_minor is None else f"/dev/dri/renderD{self.drm_render_minor}"

    @property
    def family(self) -> str:
        """The architecture family with the stepping wildcarded: gfx1010 -> ``gfx101x``."""
        return self.arch[:-1] + "x"


def arch_from_target_version(version: int) -> str:
    """``gfx_target_version`` -> LLVM target name: 100100 -> gfx1010, 90010 -> gfx90a.

    The driver packs major*10000 + minor*100 + stepping; the name prints minor and stepping
    as one hex digit each (the convention of ROCm's rocprofiler and LLVM's target names).
    """
    if version <= 0:
        raise ValueError(f"gfx_target_version {version} is not a GPU (0 means a CPU node)")
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    if minor > 15 or stepping > 15:
        raise ValueError(f"gfx_target_version {version} does not map to a gfx name")
    return f"gfx{major}{minor:x}{stepping:x}"


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
    return Path(root if root is not None else os.environ.get("ROCM_YOLO_KFD_ROOT") or KFD_ROOT)


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
            )
        )
    return gpus


def detect_arch(root=None) -> str | None:
    """The first GPU's architecture (e.g. ``"gfx1010"``), or None without an AMD GPU."""
    gpus = detect_gpus(root)
    return gpus[0].arch if gpus else None


def torch_build() -> dict:
    """torch's version, CUDA and HIP versions read from ``torch/version.py`` WITHOUT importing torch.

    Used for cache keys and "is this a ROCm build" checks in processes that must stay
    torch-free. Values are None when torch is absent or the file cannot be parsed.
    """
    info = {"torch": None, "cuda": None, "hip": None, "path": None}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return info
    info["path"] = str(next(iter(spec.submodule_search_locations)))
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            target = value = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                key = {"__version__": "torch", "cuda": "cuda", "hip": "hip"}.get(target.id)
                if key:
                    info[key] = value.value
        break
    return info


def torch_view() -> dict:
    """What torch itself sees: versions, availability, device names and gcnArchName.

    Imports torch lazily (only when called). Safe on CPU-only machines and when torch's
    GPU initialisation fails: errors are returned under ``"error"``, never raised.
    """
    view: dict = {"torch": None, "hip": None, "cuda": None, "available": False, "devices": []}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is a finding, not a crash
        view["error"] = f"import torch failed: {type(exc).__name__}: {exc}"
        return view
    view.update(torch=torch.__version__, hip=getattr(torch.version, "hip", None), cuda=torch.version.cuda)
    try:
        view["available"] = bool(torch.cuda.is_available())
        for index in range(torch.cuda.device_count() if view["available"] else 0):
            props = torch.cuda.get_device_properties(index)
            view["devices"].append(
                {
                    "index": index,
                    "name": props.name,
                    "arch": getattr(props, "gcnArchName", None),
                    "total_memory": props.total_memory,
                }
            )
    except Exception as exc:  # noqa: BLE001
        view["error"] = f"{type(exc).__name__}: {exc}"
    return view


# --------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """One setting an architecture needs.

    kind: ``"arg"`` (an Ultralytics train argument), ``"loader"`` (a DataLoader setting the
    DataLoader patch applies), ``"env"`` (an environment variable, set before torch is
    imported) or ``"tool"`` (a rocm-yolo option such as ``conv``, never passed to Ultralytics).
    """

    kind: str
    key: str
    value: object
    user_set: bool
    reason: str


def _is_gfx101x(arch: str | None) -> bool:
    return bool(arch) and arch.startswith("gfx101") and len(arch) == 7


def presets(arch: str | None, user_args: Mapping[str, object], env: Mapping[str, str]) -> list[Preset]:
    """The presets for ``arch``; ``user_set`` is True where ``user_args``/``env`` already set the key.

    Pure: reads nothing but its arguments. ``user_args`` holds the Ultralytics train args and
    loader/tool keys (``conv``) the user passed; ``env`` is the environment.
    Only gfx101x (RX 5500/5600/5700, Pro W5700...) has presets; CUDA, CPU (arch None) and
    other AMD architectures get [].
    """
    if not _is_gfx101x(arch):
        return []
    override = env.get("HSA_OVERRIDE_GFX_VERSION", "").strip()
    # The kernels MIOpen compiles and caches depend on the ISA the runtime reports, which
    # HSA_OVERRIDE_GFX_VERSION changes: keep one cache per (arch, override).
    miopen = miopen_dir(arch, override, env)
    # Each preset has a public source; docs/conv.md names them. (No pin_memory preset: no
    # source ties pinned DataLoader memory to gfx101x faults, so Ultralytics' default stays.)
    wanted = [
        ("arg", "amp", False,
         "fp16 is broken on RDNA1/2 (MIOpen's fp16 convolutions segfault: Comfy-Org/ComfyUI#15615); Ultralytics' "
         "AMP check downloads weights and lets HIP errors escape"),
        ("arg", "channels_last", False,
         "Ultralytics turns NHWC on for device type cuda, which ROCm reports; MIOpen's NHWC kernels are its "
         "less-tested, slower path on Radeon (pytorch/pytorch#110319, #170947)"),
        ("tool", "conv", "auto",
         "MIOpen often has no working gfx101x kernel: a self-test times native, aten, fp32, gemm and miopen-off "
         "and picks the fastest that works"),
        ("env", "MIOPEN_FIND_MODE", "FAST",
         "MIOpen takes its find-db entry or immediate-mode fallback instead of benchmarking every solver on "
         "first use (MIOpen docs): a quick start, no failing kernels tried one after another"),
        ("env", "PYTORCH_MIOPEN_SUGGEST_NHWC", "0",
         "keep MIOpen on NCHW kernels where a ROCm 7 build would pick NHWC (pytorch/pytorch#170947)"),
        ("env", "MIOPEN_USER_DB_PATH", str(miopen / "db"),
         "a per-user, per-architecture MIOpen database: a shared one breaks under concurrent or mixed use "
         "(ROCm/MIOpen#1878)"),
        ("env", "MIOPEN_CUSTOM_CACHE_DIR", str(miopen / "cache"),
         "a per-user, per-architecture MIOpen kernel cache, for the same reason"),
    ]
    out = []
    for kind, key, value, reason in wanted:
        user_set = key in env if kind == "env" else (key in user_args and user_args[key] is not None)
        out.append(Preset(kind, key, value, user_set, reason))
    return out


def override_advice(arch: str | None, env: Mapping[str, str]) -> str | None:
    """One line about HSA_OVERRIDE_GFX_VERSION for gfx101x, or None (never set by the tool)."""
    if not _is_gfx101x(arch):
        return None
    override = env.get("HSA_OVERRIDE_GFX_VERSION")
    if override:
        return (f"HSA_OVERRIDE_GFX_VERSION={override} (user-set): the GPU runs code built for "
                f"another architecture; if training faults, try 10.1.0 or unset it (see docs)")
    return ("HSA_OVERRIDE_GFX_VERSION is not set: official ROCm wheels ship no gfx101x code; "
            "if torch reports 'invalid device function', see the docs before setting it")


def header_lines(arch: str | None, presets: list[Preset]) -> list[str]:
    """The run header block for the presets: one line per preset, user-set ones marked."""
    if not presets:
        return [f"GPU architecture: {arch or 'none detected'} (no presets)"]
    lines = [f"GPU architecture: {arch} (presets for {arch[:-1]}x; user settings win)"]
    width = max(len(f"{p.key}={p.value}") for p in presets)
    for p in presets:
        setting = f"{p.key}={p.value}"
        if p.user_set:
            lines.append(f"  {p.kind:<6} {p.key:<{width}}  user-set, kept (preset would be {p.value!r})")
        else:
            lines.append(f"  {p.kind:<6} {setting:<{width}}  preset: {p.reason}")
    return lines
