"""The Ultralytics releases rocm-yolo is tested with, and a check of an installed version against them.

Below 8.4.158 Ultralytics' ``InfiniteDataLoader`` made its iterator in ``__init__`` (mid-epoch
resume cannot replay the sample order), below 8.4.104 the running loss was a tensor, below
8.4.8 ``optimizer=auto`` took MuSGD for short runs (CONTRIBUTING.md, "The supported
Ultralytics range"). CI runs the end-to-end subset marked ``lowerbound`` against the lower
bound; ``pyproject.toml`` declares the same range. Torch-free: the doctor and CI read it.
"""

from __future__ import annotations

import re

SUPPORTED_ULTRALYTICS = ">=8.4.158,<=8.4.190"
# The oldest torch rocm-yolo has run with: the lent H100's acceptance run (docs/speed.md, "Measured on a GPU"; CI runs
# 2.14.1). pyproject allows 2.10, the torch of AMD's ROCm wheels: a higher floor would make
# pip replace a user's ROCm build with the package index's CUDA one. So older than this is allowed, and said.
TESTED_TORCH = "2.11"


def release(text: str) -> tuple[int, ...]:
    """``"8.4.158"`` -> ``(8, 4, 158)`` (a local or pre-release suffix is ignored)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def untested_torch(installed: str) -> str | None:
    """A line saying that torch ``installed`` is older than any rocm-yolo was run with; None when it is not."""
    if release(installed) >= release(TESTED_TORCH):
        return None
    return (
        f"torch {installed} is older than any torch rocm-yolo was tested with ({TESTED_TORCH} and newer): allowed "
        "for AMD's ROCm wheels, untested"
    )


def untested(installed: str) -> str | None:
    """A line saying that Ultralytics ``installed`` is outside :data:`SUPPORTED_ULTRALYTICS`; None inside it."""
    low, high = (release(bound.lstrip("<>=")) for bound in SUPPORTED_ULTRALYTICS.split(","))
    if low <= release(installed) <= high:
        return None
    return (
        f"ultralytics {installed} is outside the tested range {SUPPORTED_ULTRALYTICS}: the internals rocm-yolo "
        f"relies on are checked, but this version is untested (pip install 'ultralytics{SUPPORTED_ULTRALYTICS}')"
    )
