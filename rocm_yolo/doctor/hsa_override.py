"""``HSA_OVERRIDE_GFX_VERSION`` against each GPU: the value that makes the runtime run a card as another architecture.

A wrong value faults or hangs the GPU (10.3.0 on gfx101x: ROCm/legacy-rocm-build#887); with GPUs of
several architectures one value cannot fit all, and ROCm 6.2+ reads ``HSA_OVERRIDE_GFX_VERSION_<n>``
for device n (ROCm#5069).
"""

from __future__ import annotations

import dataclasses

from rocm_yolo.doctor.report import FAIL, OK, WARN, Row
from rocm_yolo.gpu import wheels
from rocm_yolo.gpu.arch import family, gfx_name, gfx_version, parse_override


def override_row(arch: str | None, value: str | None) -> Row:
    """``HSA_OVERRIDE_GFX_VERSION`` against the card's arch."""
    check, name = "gpu.override", "HSA override"
    if not value:
        return Row(check, name, OK, "HSA_OVERRIDE_GFX_VERSION not set")
    parsed = parse_override(value)
    if parsed is None:
        return Row(
            check,
            name,
            FAIL,
            f"HSA_OVERRIDE_GFX_VERSION={value} is not of the form X.Y.Z",
            "unset it (unset HSA_OVERRIDE_GFX_VERSION) or give a version such as 10.3.0",
        )
    target = gfx_name(parsed)
    card = gfx_version(arch) if arch else None
    data = {"value": value, "runs_as": target, "card": arch}
    if card is None:
        return Row(
            check,
            name,
            WARN,
            f"HSA_OVERRIDE_GFX_VERSION={value} (runs as {target}) but no AMD GPU was detected",
            "unset it unless you know why it is set",
            data=data,
        )
    fits = family(arch)  # e.g. gfx101x
    fitting = f"{card[0]}.{card[1]}.0"
    if parsed == card:
        return Row(check, name, OK, f"HSA_OVERRIDE_GFX_VERSION={value} matches the {arch} card", data=data)
    if parsed[:2] == card[:2]:
        return Row(check, name, OK, f"HSA_OVERRIDE_GFX_VERSION={value} fits the {arch} card ({fits})", data=data)
    found = f"HSA_OVERRIDE_GFX_VERSION={value} runs the {arch} card as {target}, another family"
    known = wheels.KNOWN_OVERRIDES.get(fits)
    if known is not None and known.good and ".".join(map(str, parsed)) in known.crashes:
        return Row(
            check,
            name,
            WARN,
            f"{found}, reported to crash {fits} cards",
            f"use HSA_OVERRIDE_GFX_VERSION={known.good} with a torch that has {arch} code, or unset it "
            f"({known.source})",
            data=dict(data, source=known.source),
        )
    if parsed[0] == card[0]:
        return Row(
            check,
            name,
            WARN,
            found,
            f"use {fitting}, which fits {fits}, or unset it; keep {value} only if a test run is stable",
            data=data,
        )
    return Row(
        check,
        name,
        FAIL,
        found + " of another generation: kernels will fault or hang",
        f"unset HSA_OVERRIDE_GFX_VERSION or set {fitting}",
        data=data,
    )


RANK_ORDER = {FAIL: 0, WARN: 1, OK: 2}


def override_rows(gpus: list, env) -> Row:
    """The HSA override against every GPU (``HSA_OVERRIDE_GFX_VERSION``, or a GPU's own
    ``HSA_OVERRIDE_GFX_VERSION_<n>``, which ROCm 6.2+ reads for device n: ROCm#5069): one row, the worst GPU's."""
    rows = []
    for i, gpu in enumerate(gpus):
        own = env.get(f"HSA_OVERRIDE_GFX_VERSION_{i}")
        rows.append((i, gpu, own, override_row(gpu.arch, own or env.get("HSA_OVERRIDE_GFX_VERSION"))))
    if len({gpu.arch for gpu in gpus}) == 1 and not any(own for _, _, own, _ in rows):
        return rows[0][3]
    i, gpu, own, worst = min(rows, key=lambda r: RANK_ORDER.get(r[3].status, 3))
    if worst.status == OK:
        return Row(
            worst.check, worst.name, OK, f"fits each GPU ({', '.join(r[3].found for r in rows)})", data=worst.data
        )
    per_gpu = (
        f"; with GPUs of several architectures set one per GPU, e.g. HSA_OVERRIDE_GFX_VERSION_{i}=... for GPU {i} "
        "only (ROCm 6.2+ reads HSA_OVERRIDE_GFX_VERSION_<n> for device n: ROCm#5069)"
    )
    return dataclasses.replace(worst, found=f"GPU {i} ({gpu.arch}): {worst.found}", fix=(worst.fix or "") + per_gpu)
