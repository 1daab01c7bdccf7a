"""The GPUs of a run, read without torch: one GPU, or several (Ultralytics' DDP), and a rank's own number.

``--device 0,1`` trains on two GPUs: the supervisor starts the DDP launcher instead of the training
child (:func:`launches_ranks`), which starts one rank per GPU with ``torch.distributed.run``, as
Ultralytics does; each rank is a training child of its own (:mod:`rocm_yolo.ddp.launcher`). A rank
knows itself by the variables torch's launcher sets (:data:`rocm_yolo.environment.RANK` and its
neighbours). On more than one machine each node does the same (:mod:`.nodes`: the nodes and their
round).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from rocm_yolo import environment
from rocm_yolo.errors import option

if TYPE_CHECKING:
    from rocm_yolo.run.nodes import Nodes


def devices_named(device: object) -> list[str]:
    """The devices a ``device`` argument names, as Ultralytics' ``parse_device`` reads it: ``"0,1"``,
    ``[0, 1]``, ``"cuda:0,1"`` and ``"0, 1"`` -> ``["0", "1"]``; ``"cpu"`` -> ``["cpu"]``; auto -> []."""
    if isinstance(device, (list, tuple)):
        text = ",".join(str(x) for x in device)
    else:
        text = str(device if device is not None else "")
    text = text.lower().replace("cuda:", "").replace("none", "")
    for char in "[]()'\" ":
        text = text.replace(char, "")
    if text == "cuda":  # the current CUDA/HIP device: GPU 0
        text = "0"
    return [str(int(x)) if x.isdigit() else x for x in text.split(",") if x]


# What Ultralytics' select_device trains on besides GPU ids (``0``, ``0,1``, ``cuda:0``; ``-1``: an idle GPU): the CPU,
# Apple's MPS (the CPU where there is none), and the npu and xpu backends of their own torch builds. It passes tpu,
# intel and vulkan through for its exported models' inference; a training on them fails inside Ultralytics.
DEVICE_KINDS = ("cpu", "mps", "mps:0")
BACKENDS = ("npu", "xpu")


def check_kind(device: object) -> str | None:
    """Why ``device`` names no device Ultralytics trains on, or None."""
    named = devices_named(device)
    if not named or ",".join(named) in DEVICE_KINDS or named[0].startswith(BACKENDS):
        return None
    if all(x.isdigit() or x == "-1" for x in named):
        return None
    return (
        f"{option('device', device)}: not a device Ultralytics trains on: give cpu, a GPU id (0), several (0,1), or "
        "-1 (an idle GPU)"
    )


def gpu_ids(device: object) -> list[str]:
    """The GPU ids a ``device`` argument names (``"0,1"`` -> ``["0", "1"]``); [] for ``cpu``, ``mps``,
    auto (None, ``""``) and anything else that is not a list of ids."""
    named = devices_named(device)
    return named if named and all(x.isdigit() for x in named) else []


def check_list(device: object) -> str | None:
    """Why a ``device`` that names several devices cannot be a multi-GPU run of rocm-yolo, or None."""
    named = devices_named(device)
    if len(named) < 2 or all(x.isdigit() for x in named):
        return None
    return (
        f"{option('device', device)}: several devices must be GPU ids, each named (e.g. --device 0,1); "
        "auto-selected (-1) and other kinds of devices cannot be split into ranks here"
    )


def world_size(train_args: Mapping[str, object], nodes: Nodes | None = None) -> int:
    """How many ranks a run with these train arguments trains on: the GPU ids of ``device`` (at least 1), on
    every node of ``nodes``."""
    return max(len(gpu_ids(train_args.get("device"))), 1) * (nodes.count if nodes else 1)


def launches_ranks(train_args: Mapping[str, object], nodes: Nodes | None = None) -> bool:
    """Whether the training child launches ranks with ``torch.distributed.run``: several GPUs, or several nodes."""
    return nodes is not None or world_size(train_args) > 1


def rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank when ``torch.distributed.run`` started it, else None."""
    if environment.LOCAL_RANK not in environ:
        return None
    try:
        return int(environ.get(environment.RANK, environ[environment.LOCAL_RANK]))
    except ValueError:
        return None


def local_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank among its node's ranks when ``torch.distributed.run`` started it, else None."""
    try:
        return int(environ[environment.LOCAL_RANK])
    except (KeyError, ValueError):
        return None


def check_batch(batch: object, ids: list[str], source: str = "given", nodes: int = 1) -> str | None:
    """Why ``batch`` cannot be split across the GPUs ``ids`` of each of ``nodes`` machines (Ultralytics gives each
    rank batch // N), or None. ``source``: where the batch comes from, which the message says: ``given`` (the
    user's), ``default`` (Ultralytics'), ``run`` (the resumed run's own, which a resume keeps)."""
    n = len(ids) * nodes
    if n < 2:
        return None
    value = batch
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # batch=8.0 is 8, as --batch reads it
    example = f"batch={n * 8}"
    gpus = option("device", ",".join(ids)) + (f" on each of {nodes} nodes" if nodes > 1 else "")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return (
            f"batch={value}: AutoBatch and fractions work on one GPU only (Ultralytics); on the {n} GPUs of "
            f"{gpus} give a batch that divides by {n}, e.g. {example}"
        )
    if value % n:
        what = {"default": f"the default batch {value}", "run": f"the run's batch {value}"}.get(
            source, f"batch={value}"
        )
        fix = f"use a multiple of {n}, e.g. {example}"
        if source == "run":  # the global batch stays the run's: a number of GPUs it divides by, or a new batch
            fits = [k for k in range(2, value + 1) if value % k == 0][:3]
            fix = f"resume on {' or '.join(map(str, fits)) if fits else 'one'} GPU(s), or give {option('batch', n * 8)}"
        return f"{what} does not divide by the {n} GPUs of {gpus} (each rank trains batch/{n} images): {fix}"
    return None
