"""The doctor's checks for more than one GPU (``--device 0,1``: one DDP rank per GPU, RCCL between them).

- **each GPU**: its architecture and its render node (a container given ``/dev/dri/renderD128``
  alone sees one GPU of two); mixed architectures are flagged: every rank runs the same model,
  so the torch must carry code for each, and the run goes at the pace of the slowest card;
- **RCCL's prerequisites** on the kernel command line (``/proc/cmdline``), each with a public
  source. There is one so far: ``iommu=pt``. RCCL warns at start-up when it is missing, and
  without it multi-GPU runs hang.
"""

from __future__ import annotations

from typing import Iterator

from rocm_yolo.doctor.options import Options
from rocm_yolo.doctor.report import FAIL, OK, WARN, Row
from rocm_yolo.gpu import wheels
from rocm_yolo.gpu.arch import architectures
from rocm_yolo.gpu.known_fixes import RCCL_KERNEL_OPTIONS


def check_multi_gpu(opts: Options, gpus: list) -> Iterator[Row]:
    """Rows for a machine with two or more AMD GPUs (nothing for fewer)."""
    if len(gpus) < 2:
        return
    yield _architectures(gpus)
    yield from _render_nodes(opts, gpus)
    yield from _kernel_options(opts)


def _architectures(gpus: list) -> Row:
    archs = architectures(gpus)
    listing = "; ".join(f"GPU {i}: {g.describe()}" for i, g in enumerate(gpus))
    data = {"gpus": len(gpus), "archs": archs}
    if len(archs) == 1:
        return Row("gpu.multi", "GPUs for DDP", OK, f"{len(gpus)} GPUs, all {archs[0]} ({listing})", data=data)
    return Row(
        "gpu.multi",
        "GPUs for DDP",
        WARN,
        f"{len(gpus)} GPUs of mixed architectures {', '.join(archs)} ({listing})",
        "every rank runs the same model: torch needs code for each ("
        + wheels.choose(archs, env={}).advice()
        + "), and the run goes at the pace of the slowest GPU; --device can name same-architecture GPUs only",
        data=data,
    )


def _render_nodes(opts: Options, gpus: list) -> Iterator[Row]:
    missing = [
        f"GPU {i} ({g.arch}): {g.render_device}"
        for i, g in enumerate(gpus)
        if g.render_device and not opts.path(g.render_device).exists()
    ]
    if missing:
        yield Row(
            "gpu.multi_devices",
            "each GPU's device",
            FAIL,
            f"render node missing for {'; '.join(missing)}",
            "in Docker: pass every GPU (--device=/dev/dri, or each /dev/dri/renderD* of the GPUs to train on)",
            data={"missing": missing},
        )


def _kernel_options(opts: Options) -> Iterator[Row]:
    path = opts.path("/proc/cmdline")
    try:
        cmdline = path.read_text().split()
    except OSError as e:
        yield Row("gpu.rccl", "RCCL prerequisites", WARN, f"cannot read /proc/cmdline ({e.strerror or e})")
        return
    for option, risk, source in RCCL_KERNEL_OPTIONS:  # shared with the watchdog's verdicts
        if option in cmdline:
            yield Row("gpu.rccl", "RCCL prerequisites", OK, f"{option} is on the kernel command line")
        else:
            yield Row(
                "gpu.rccl",
                "RCCL prerequisites",
                WARN,
                f"{option} is not on the kernel command line: {risk}",
                f"add {option} to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub (or grub2-mkconfig) and "
                f"reboot; sources: {source}",
                data={"option": option, "source": source},
            )
