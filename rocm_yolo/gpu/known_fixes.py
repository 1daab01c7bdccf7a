"""The known fixes for GPU faults, GPU hangs and hung collectives, each with the public source that says it helps.

The watchdog's verdict (:mod:`rocm_yolo.diagnosis.remedies`) names them when a GPU failure comes back, and the
doctor names the same ones (its kernel-log row, its RCCL row): a fix is listed only where a public source reports
that it helps, and only for the cards the source is about. Pure: reads nothing but its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rocm_yolo.gpu.arch import family
from rocm_yolo.gpu.wheels import KNOWN_OVERRIDES, choose


@dataclass(frozen=True)
class Fix:
    text: str
    source: str

    def line(self) -> str:
        return f"{self.text} ({self.source})"


RADEON_MULTI_GPU_GUIDE = "AMD's Radeon multi-GPU guide (known issue: application hangs on multi-GPU systems)"

# What RCCL needs on the kernel command line: (the option, what happens without it, public sources)
RCCL_KERNEL_OPTIONS = (
    (
        "iommu=pt",
        "collectives between the GPUs may hang (RCCL warns of it at start-up)",
        "ROCm/rccl#1129 (DDP training hangs), ROCm/rccl-tests#50 (RCCL's own warning), " + RADEON_MULTI_GPU_GUIDE,
    ),
)
IOMMU_PT = Fix("iommu=pt on the kernel command line", RCCL_KERNEL_OPTIONS[0][2])
MES_FIX = Fix(
    "amdgpu.cwsr_enable=0 on the kernel command line (the MES/CWSR hangs of gfx1151 APUs)",
    "ROCm/ROCm#5724, ROCm/ROCm#6530",
)
P2P_OFF = Fix(
    "NCCL_P2P_DISABLE=1: RCCL passes data through host memory instead of PCIe peer-to-peer",
    "ROCm/rocm-systems#11348 (4x Radeon AI PRO R9700 hang over PCIe P2P), ROCm/ROCm#6074 (collectives fail on "
    "2x RX 7900 XTX)",
)
SHM_ROOM = Fix(
    "a /dev/shm with room for NCCL's segments (docker run --ipc=host, or --shm-size=8g), or NCCL_SHM_DISABLE=1",
    "NVIDIA/nccl's environment variables (NCCL_SHM_DISABLE); docker run's --shm-size",
)
FINE_GRAIN = Fix("HSA_FORCE_FINE_GRAIN_PCIE=1, which RCCL's PCIe peer-to-peer needs", "ROCm/rccl#92")
SLOTS = Fix(
    "each GPU in a slot wired to the CPU's PCIe lanes, not the chipset's (check with lspci -tv)", RADEON_MULTI_GPU_GUIDE
)
PAGE_NOT_PRESENT = Fix(
    "a known open issue: 'page not present' faults in PyTorch training", "ROCm/ROCm#5051, still reported on gfx1100"
)
AMP_AND_CONV = Fix(
    "keep rocm-yolo's gfx101x presets: amp=False (fp16 convolutions segfault on RDNA1/2) and the Conv2d strategy its "
    "self-test picks (--conv auto; docs/conv.md)",
    "Comfy-Org/ComfyUI#15615",
)


CONV_GEMM = Fix(
    "--conv gemm: rocm-yolo's convolutions as matrix products, without MIOpen's convolution kernels (docs/conv.md)",
    "ROCm/MIOpen#3077 (MIOpen convolutions that fail on a card)",
)
AMP_OFF = Fix("amp=False: MIOpen's BatchNorm fails under AMP on some cards", "ROCm/rocm-libraries#2169")
DOCTOR = Fix("rocm-yolo doctor DATA: checks this machine's driver, devices, groups and torch build", "docs/doctor.md")
WHEELS_SOURCE = "ROCm/TheRock SUPPORTED_GPUS.md; Ultralytics' AMD guide (docs/en/integrations/amd.md)"


def environment_fixes(
    archs: list[str], env: Mapping[str, str], *, miopen: bool = False, amp: object = None
) -> list[Fix]:
    """What makes the installed software run on ``archs`` (the KFD topology's; [] when it shows no AMD GPU):
    a torch built for the card, the override value known for its family, and, for MIOpen's failures (``miopen``),
    the conv strategy that avoids MIOpen and AMP off (``amp``: the run's amp setting)."""
    fixes: list[Fix] = []
    if archs:
        choice = choose(archs, {})
        fixes.append(Fix(f"a torch built for {', '.join(archs)}: {choice.advice()}", WHEELS_SOURCE))
        override = (env.get("HSA_OVERRIDE_GFX_VERSION") or "").strip()
        for fam in dict.fromkeys(family(a) for a in archs):
            known = KNOWN_OVERRIDES.get(fam)
            if known is None or not known.good or override == known.good:
                continue
            now = f" instead of {override}" if override else ""
            fixes.append(Fix(f"HSA_OVERRIDE_GFX_VERSION={known.good} on {fam}{now}", known.source))
    else:
        fixes.append(
            Fix("no AMD GPU in the KFD topology: the driver, /dev/kfd and the render group first", DOCTOR.source)
        )
    if miopen:
        fixes.append(CONV_GEMM)
        if amp not in (False, "False", "false", 0):
            fixes.append(AMP_OFF)
    fixes.append(DOCTOR)
    return fixes


OVERRIDE_SOURCE = (
    "ROCm/rocm-systems#3461 and #5686 (libhsakmt refuses an override that is not the card's own: crashes, GPU "
    "resets, hangs); ROCm/ROCT-Thunk-Interface#104 (HSA_OVERRIDE_GFX_VERSION_<node>: one card's own)"
)


def override_fix(card: str, value: str) -> Fix:
    """An ``HSA_OVERRIDE_GFX_VERSION`` that runs ``card`` as another architecture: the card's known override, or
    none."""
    known = KNOWN_OVERRIDES.get(family(card))
    if known is not None and known.good:
        return Fix(
            f"HSA_OVERRIDE_GFX_VERSION={known.good} for a {card} card instead of {value} (or none, with a torch built "
            f"for {card})",
            f"{known.source}; {OVERRIDE_SOURCE}",
        )
    return Fix(
        f"no HSA_OVERRIDE_GFX_VERSION (unset it, and any HSA_OVERRIDE_GFX_VERSION_<node>): {value} runs the {card} "
        f"card as another architecture; a torch built for {card} runs it as itself",
        OVERRIDE_SOURCE,
    )


def kernel_matrix(release: str) -> Fix:
    return Fix(
        f"a Linux kernel that AMD's compatibility matrix lists for your ROCm release (this one runs {release})",
        "AMD's ROCm documentation, system requirements (Linux)",
    )


def gpu_failure_fixes(
    archs: list[str],
    env: Mapping[str, str],
    *,
    kernel_kinds: set[str] = frozenset(),
    kernel_release: str = "",
    user_args: Mapping[str, object] = {},
    page_not_present: bool = False,
    multi_gpu: bool = False,
) -> list[Fix]:
    """The known fixes for a GPU fault or a GPU hang on ``archs`` (the KFD topology's), each with its source.

    ``env`` is the environment the run had (its ``HSA_OVERRIDE_GFX_VERSION``), ``kernel_kinds`` what the kernel log
    said in the failure's window (:func:`rocm_yolo.gpu.kernel_log.kinds`), ``user_args`` the train arguments the user
    set (``amp``, ``conv``).
    """
    fixes: list[Fix] = []
    override = (env.get("HSA_OVERRIDE_GFX_VERSION") or "").strip()
    families = list(dict.fromkeys(family(a) for a in archs))
    for fam in families:
        known = KNOWN_OVERRIDES.get(fam)
        if known is not None and override and (override in known.crashes or known.good and override != known.good):
            good = f"{known.good} (with a torch that carries its code)" if known.good else "no override"
            fixes.append(Fix(f"HSA_OVERRIDE_GFX_VERSION={override} on {fam}: use {good}", known.source))
    if "gfx101x" in families:
        amp, conv = user_args.get("amp"), user_args.get("conv")
        if amp not in (None, False) or conv not in (None, "auto"):
            fixes.append(AMP_AND_CONV)
    if "MES" in kernel_kinds or any(f.startswith("gfx115") for f in families):
        fixes.append(MES_FIX)
    if page_not_present:
        fixes.append(PAGE_NOT_PRESENT)
    if multi_gpu:
        fixes.append(IOMMU_PT)
    if kernel_release:
        fixes.append(kernel_matrix(kernel_release))
    return fixes


def collective_fixes(p2p_off: bool) -> list[Fix]:
    """What remains for a collective that hangs between consumer cards (after ``NCCL_P2P_DISABLE=1`` if ``p2p_off``)."""
    first = [] if p2p_off else [P2P_OFF]
    return [*first, FINE_GRAIN, SLOTS, IOMMU_PT]
