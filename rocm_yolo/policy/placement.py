"""Where a run's images go, the policy: the devices a ``device`` argument may name, a batch over several GPUs, and a
run's :class:`~rocm_yolo.run.devices.Layout` on other GPUs than its own.

The request is held to it before anything starts (:mod:`rocm_yolo.request.validation`: ``--device``, the batch, the
rounds of ``--nnodes MIN:MAX``), the training child again on the GPUs it has now (:func:`relayout`), and
``rocm-yolo status`` says what an attempt trains on (:func:`fits`). The records themselves, the run's
:class:`~rocm_yolo.run.devices.Layout` and :class:`~rocm_yolo.run.devices.Relayout`, travel in the spec
(:mod:`rocm_yolo.run.devices`). Each check returns why a value is refused (one line), or raises
:class:`~rocm_yolo.errors.UsageError` with it; pure, torch-free.
"""

from __future__ import annotations

from rocm_yolo.errors import UsageError, option
from rocm_yolo.run.devices import Layout, Relayout, devices_named

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


def check_list(device: object) -> str | None:
    """Why a ``device`` that names several devices cannot be a multi-GPU run of rocm-yolo, or None."""
    named = devices_named(device)
    if len(named) < 2 or all(x.isdigit() for x in named):
        return None
    return (
        f"{option('device', device)}: several devices must be GPU ids, each named (e.g. --device 0,1); "
        "auto-selected (-1) and other kinds of devices cannot be split into ranks here"
    )


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


def fits(layout: Layout, gpus: int) -> bool:
    """Whether ``layout`` can train on ``gpus`` GPUs with each step's images kept and no GPU's batch grown."""
    if gpus < 1:
        return False
    if gpus <= layout.world:
        return layout.world % gpus == 0
    return gpus % layout.world == 0 and layout.rank_batch % (gpus // layout.world) == 0


def gpu_counts_that_fit(layout: Layout, most: int = 64) -> list[int]:
    """The numbers of GPUs (up to ``most``) ``layout`` trains on with each step's images kept."""
    return [n for n in range(1, most + 1) if fits(layout, n)]


def relayout(layout: Layout, gpus: int, where: str = "", fix: str = "resume on {counts} GPUs") -> Relayout:
    """``layout`` on ``gpus`` GPUs; :class:`UsageError` in one line when no GPU count of that kind can keep each
    step's images (``where``: how the user named the GPUs; ``fix``: what to do, with the counts that work)."""
    if fits(layout, gpus):
        return Relayout(layout, gpus)
    counts = gpu_counts_that_fit(layout, max(2 * gpus, 2 * layout.world, 8))
    shown = ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}" if len(counts) > 1 else str(counts[0])
    on = f"on {layout.world} GPUs ({layout.rank_batch} each)" if layout.world > 1 else "on one GPU"
    raise UsageError(
        f"{where or f'{gpus} GPUs'}: the run trains {layout.batch} images a step {on}, which {gpus} GPUs cannot "
        f"share out exactly without a GPU taking more: {fix.format(counts=shown)}, or give batch=N to start a new "
        "global batch on purpose (the position in the epoch is kept)"
    )


def check_rounds(layout: Layout, per_node: int, counts: range, where: str) -> None:
    """Every round of ``counts`` nodes of ``per_node`` GPUs (``--nnodes MIN:MAX``) can train ``layout`` exactly, on
    two GPUs or more (a rank alone has no process group); :class:`UsageError` naming the first that cannot."""
    for nodes in counts:
        gpus = nodes * per_node
        named = f"{where}: a round of {nodes} node{'s' if nodes > 1 else ''} ({gpus} GPU{'s' if gpus > 1 else ''})"
        if gpus < 2:
            raise UsageError(
                f"{named} would be one rank alone: give a MIN that leaves two GPUs or more (a single GPU left goes "
                "on with --resume RUN on that node, without the node flags)"
            )
        relayout(layout, gpus, named, "choose MIN:MAX so that every round has {counts} GPUs")
