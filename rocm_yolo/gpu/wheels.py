"""Which torch to install for this machine: the one answer the Makefile, the doctor and the README use.

AMD publishes PyTorch wheels per GPU architecture: ``torch[device-gfxNNNN]`` and
``torchvision[device-gfxNNNN]`` from AMD's wheel index, the architecture read from the KFD
topology as Ultralytics' AMD guide does it (``docs/en/integrations/amd.md`` in
ultralytics/ultralytics). pytorch.org's own ROCm wheels carry no code for consumer cards
such as gfx1010 (pytorch/pytorch#132570). Without an AMD GPU the package index's default
torch is the choice. ``TORCH_SPEC`` and ``TORCH_INDEX`` override it. docs/torch.md lists the
sources, with the date they were read: these indexes and names change.

Torch-free and dependency-free: ``python3 -m rocm_yolo.gpu.wheels`` runs before any venv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Mapping

from rocm_yolo.gpu.arch import architectures, detect_gpus, family, gfx_name, parse_override

AMD_INDEX = "https://stable.repo.amd.com/rocm/whl-next/"  # Ultralytics' AMD guide, read 2026-11-24
READ_ON = "2026-11-24"
# ROCm/TheRock SUPPORTED_GPUS.md, ROCm on Linux (read 2026-11-24): the architectures AMD builds wheels for,
# and whether they are sanity-tested and release-ready ("tested") or only built ("built").
AMD_WHEEL_ARCHS = {
    **dict.fromkeys(
        (
            "gfx942",
            "gfx1201",
            "gfx1200",
            "gfx1152",
            "gfx1151",
            "gfx1150",
            "gfx1103",
            "gfx1102",
            "gfx1101",
            "gfx1100",
            "gfx1036",
            "gfx1035",
            "gfx1034",
            "gfx1033",
            "gfx1032",
            "gfx1031",
            "gfx1030",
            "gfx1012",
            "gfx1011",
            "gfx1010",
        ),
        "tested",
    ),
    **dict.fromkeys(("gfx950", "gfx90a", "gfx908", "gfx906", "gfx900", "gfx1153"), "built"),
}


@dataclass(frozen=True)
class Override:
    """What is known of ``HSA_OVERRIDE_GFX_VERSION`` for one architecture family, with its public sources
    (docs/torch.md lists them with the date they were read)."""

    good: str | None  # a value reported to work (with a build carrying that architecture's code)
    crashes: tuple[str, ...]  # values reported to crash cards of the family
    source: str


KNOWN_OVERRIDES = {
    "gfx101x": Override(
        "10.1.0",
        ("10.3.0",),
        "ROCm/legacy-rocm-build#887: 10.3.0 crashes an RX 5700, 10.1.0 works with a gfx1010 build",
    ),
    "gfx103x": Override(
        "10.3.0",
        (),
        "ROCm/legacy-rocm-build#2720, ace-step/ACE-Step-1.5#658: RX 6700 XT (gfx1031) runs as gfx1030 with 10.3.0",
    ),
}


@dataclass(frozen=True)
class TorchChoice:
    """What to install: the requirement specifiers, the index (None: the package index's default), and why."""

    specs: tuple[str, ...]
    index: str | None
    why: str
    archs: tuple[str, ...] = ()

    def pip_args(self) -> list[str]:
        return [*self.specs, *(["--index-url", self.index] if self.index else [])]

    def command(self) -> str:
        return "pip install " + shlex.join(self.pip_args())

    def advice(self) -> str:
        """For the doctor: the install line (and why), or, where AMD has no wheels for the card, what remains."""
        if self.archs and self.index is None:
            return self.why
        return f"{self.command()} ({self.why})"


def override_note(arch: str) -> str:
    """What remains for an architecture AMD publishes no wheels for."""
    known = KNOWN_OVERRIDES.get(family(arch))
    distro = "a distribution's ROCm build of torch that carries its code (e.g. PYTORCH_ROCM_ARCH=" + arch + ")"
    if known is None or known.good is None:
        return f"AMD publishes no torch wheels for {arch}: use {distro}"
    runs_as = gfx_name(parse_override(known.good))
    wheels = f"AMD's {runs_as} wheels" if runs_as in AMD_WHEEL_ARCHS else f"a torch with {runs_as} code"
    return (
        f"AMD publishes no torch wheels for {arch}: use {distro}, or {wheels} with "
        f"HSA_OVERRIDE_GFX_VERSION={known.good}, which runs the card as {runs_as} (a wrong value faults or hangs "
        f"the GPU; {known.source})"
    )


# A requirement pip takes: a name, extras, version clauses (PEP 508 without markers or URLs)
_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?([<>=!~]=?=?[A-Za-z0-9.*+!_-]+(,[<>=!~]=?=?[A-Za-z0-9.*+!_-]+)*)?$"
)


class ChoiceError(ValueError):
    """TORCH_SPEC or TORCH_INDEX is not something pip can take (one line, naming the variable)."""


def choose(archs: list[str], env: Mapping[str, str] = os.environ) -> TorchChoice:
    """The torch for a machine with the AMD architectures ``archs`` ([] without an AMD GPU)."""
    spec, index = env.get("TORCH_SPEC", "").split(), env.get("TORCH_INDEX") or None
    bad = [s for s in spec if not _REQUIREMENT.match(s)]
    if bad:
        raise ChoiceError(
            f"TORCH_SPEC={env['TORCH_SPEC']!r}: {bad[0]!r} is not a pip requirement "
            "(e.g. TORCH_SPEC='torch==2.14.1 torchvision==0.29.1')"
        )
    if index and not re.match(r"^(https?|file)://\S+$", index):
        raise ChoiceError(
            f"TORCH_INDEX={index!r} is not an index URL (e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu)"
        )
    if spec or index:
        why = "TORCH_SPEC/TORCH_INDEX given"
        if index:  # pip's --index-url replaces the default index only
            why += "; pip also looks in the indexes and links your pip configuration names (pip config list)"
        return TorchChoice(tuple(spec or ("torch", "torchvision")), index, why, tuple(archs))
    if not archs:
        return TorchChoice(("torch", "torchvision"), None, "no AMD GPU: the package index's default torch")
    wheels = sorted({a for a in archs if a in AMD_WHEEL_ARCHS})
    missing = sorted(set(archs) - set(wheels))
    if not wheels:
        return TorchChoice(("torch", "torchvision"), None, override_note(missing[0]), tuple(archs))
    extras = ",".join(f"device-{a}" for a in wheels)
    untested = [a for a in wheels if AMD_WHEEL_ARCHS[a] == "built"]
    why = f"AMD's wheels for {', '.join(wheels)}"
    if untested:  # TheRock: "Build Passing" alone does not imply the runtime works on the card
        why += f"; {', '.join(untested)}: built by AMD but not yet sanity-tested, watch the first run"
    if missing:
        why += f"; {override_note(missing[0])}"
    return TorchChoice((f"torch[{extras}]", f"torchvision[{extras}]"), AMD_INDEX, why, tuple(archs))


def for_this_machine(env: Mapping[str, str] = os.environ, root=None) -> TorchChoice:
    """:func:`choose` for the GPUs of the KFD topology (``$ROCM_YOLO_KFD_ROOT`` in tests)."""
    return choose(architectures(detect_gpus(root)), env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocm_yolo.gpu.wheels", description=__doc__.splitlines()[0])
    parser.add_argument("--pip-args", action="store_true", help="print pip's arguments, shell-quoted")
    parser.add_argument("--why", action="store_true", help="print why this torch")
    args = parser.parse_args(argv)
    try:
        choice = for_this_machine()
    except ChoiceError as e:
        print(e, file=sys.stderr)
        return 2
    if args.pip_args or args.why:
        print(shlex.join(choice.pip_args()) if args.pip_args else choice.why)
    else:
        print(f"{choice.command()}   # {choice.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
