"""Per-architecture presets: the settings a given AMD architecture needs to train at all.

gfx101x (RX 5500/5600/5700): no AMP, no channels_last, a convolution strategy chosen by
self-test, MIOpen's fast find mode on NCHW kernels, a private MIOpen cache; docs/conv.md
names the public source of each. :func:`presets` is pure: it says what it would set and
whether the user has already set it; the caller applies the ones the user has not set and
prints all of them. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rocm_yolo.run.paths import miopen_dir


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
        (
            "arg",
            "amp",
            False,
            "fp16 is broken on RDNA1/2 (MIOpen's fp16 convolutions segfault: Comfy-Org/ComfyUI#15615); Ultralytics' "
            "AMP check downloads weights and lets HIP errors escape",
        ),
        (
            "arg",
            "channels_last",
            False,
            "Ultralytics turns NHWC on for device type cuda, which ROCm reports; MIOpen's NHWC kernels are its "
            "less-tested, slower path on Radeon (pytorch/pytorch#110319, #170947)",
        ),
        (
            "tool",
            "conv",
            "auto",
            "MIOpen often has no working gfx101x kernel: a self-test times native, aten, fp32, gemm and miopen-off "
            "and picks the fastest that works",
        ),
        (
            "env",
            "MIOPEN_FIND_MODE",
            "FAST",
            "MIOpen takes its find-db entry or immediate-mode fallback instead of benchmarking every solver on "
            "first use (MIOpen docs): a quick start, no failing kernels tried one after another",
        ),
        (
            "env",
            "PYTORCH_MIOPEN_SUGGEST_NHWC",
            "0",
            "keep MIOpen on NCHW kernels where a ROCm 7 build would pick NHWC (pytorch/pytorch#170947)",
        ),
        (
            "env",
            "MIOPEN_USER_DB_PATH",
            str(miopen / "db"),
            "a per-user, per-architecture MIOpen database: a shared one breaks under concurrent or mixed use "
            "(ROCm/MIOpen#1878)",
        ),
        (
            "env",
            "MIOPEN_CUSTOM_CACHE_DIR",
            str(miopen / "cache"),
            "a per-user, per-architecture MIOpen kernel cache, for the same reason",
        ),
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
        return (
            f"HSA_OVERRIDE_GFX_VERSION={override} (user-set): the GPU runs code built for "
            f"another architecture; if training faults, try 10.1.0 or unset it (see docs)"
        )
    return (
        "HSA_OVERRIDE_GFX_VERSION is not set: official ROCm wheels ship no gfx101x code; "
        "if torch reports 'invalid device function', see the docs before setting it"
    )


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
