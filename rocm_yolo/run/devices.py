"""The GPUs of a run, read without torch: one GPU, or several (Ultralytics' DDP), and a rank's own number.

``--device 0,1`` trains on two GPUs: the supervisor starts the DDP launcher instead of the training
child (:func:`launches_ranks`), which starts one rank per GPU with ``torch.distributed.run``, as
Ultralytics does; each rank is a training child of its own (:mod:`rocm_yolo.ddp.launcher`). A rank
knows itself by the variables torch's launcher sets (:data:`rocm_yolo.environment.RANK` and its
neighbours). On more than one machine each node does the same (:mod:`.nodes`: the nodes and their
round).

A run keeps the :class:`Layout` it started with (its GPUs and each one's share of the batch); an attempt on another
number of GPUs trains it as a :class:`Relayout`: the same images each step, no GPU's batch grown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from rocm_yolo import environment
from rocm_yolo.errors import UsageError, option

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


def world_now(environ: Mapping[str, str] = os.environ) -> int:
    """The ranks this process's attempt trains on: torch's ``WORLD_SIZE`` in a rank (on several machines, the nodes
    that met this round), else 1."""
    try:
        return max(int(environ[environment.WORLD_SIZE]), 1) if rank(environ) is not None else 1
    except (KeyError, ValueError):
        return 1


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


# --------------------------------------------------------------------------- the run's batch over its GPUs


@dataclass(frozen=True)
class Layout:
    """How a run lays each step's images over GPUs: ``world`` ranks of ``rank_batch`` images each.

    It is fixed when the run starts (the GPUs it had, Ultralytics' global ``batch`` split among them) and kept by
    every later attempt, whatever GPUs that one gets: the sample order of each epoch, the images of each step and
    Ultralytics' counters (``nb``, ``ni``, warm-up, ``accumulate``) are those of this layout (:class:`Relayout`).
    """

    world: int
    rank_batch: int

    @property
    def batch(self) -> int:
        """Ultralytics' (global) ``batch``: the images of one step over every rank."""
        return self.world * self.rank_batch

    def to_dict(self) -> dict:
        return {"world": self.world, "rank_batch": self.rank_batch}

    @classmethod
    def from_dict(cls, d: object) -> "Layout | None":
        if not isinstance(d, Mapping):
            return None
        try:
            world, rank_batch = int(d["world"]), int(d["rank_batch"])
        except (KeyError, TypeError, ValueError):
            return None
        return cls(world, rank_batch) if world >= 1 and rank_batch >= 1 else None

    @classmethod
    def of(cls, batch: object, world: int) -> "Layout | None":
        """The layout of a run of ``world`` GPUs and Ultralytics' ``batch`` (None: AutoBatch, a fraction, unknown)."""
        if isinstance(batch, float) and batch.is_integer():
            batch = int(batch)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < world or world < 1 or batch % world:
            return None
        return cls(world, batch // world)


@dataclass(frozen=True)
class Relayout:
    """A run's :class:`Layout` trained on ``gpus`` GPUs now, with each step's images kept.

    - the same number: nothing changes;
    - fewer, ``gpus`` dividing ``world``: each GPU serves ``serves`` of the layout's ranks in turn, a micro-batch of
      ``rank_batch`` images each (its batch never grows), its gradients accumulated before the step: every
      micro-batch, and so every BatchNorm batch, is the one the layout's rank had (Horovod's advice);
    - more, a multiple of ``world`` with ``rank_batch`` dividing by ``parts = gpus // world``: each of the layout's
      ranks is split over ``parts`` GPUs of ``rank_batch // parts`` images.
    """

    layout: Layout
    gpus: int

    @property
    def serves(self) -> int:
        return self.layout.world // self.gpus if self.gpus < self.layout.world else 1

    @property
    def parts(self) -> int:
        return self.gpus // self.layout.world if self.gpus > self.layout.world else 1

    @property
    def gpu_batch(self) -> int:
        """The images of one micro-batch on one GPU."""
        return self.layout.rank_batch // self.parts

    @property
    def changed(self) -> bool:
        return self.gpus != self.layout.world

    @property
    def train_batch(self) -> int:
        """Ultralytics' ``batch`` for this attempt: its per-rank share (``batch // world_size``) is ``gpu_batch``."""
        return self.gpus * self.gpu_batch

    def ranks_of(self, gpu: int) -> tuple[int, ...]:
        """The layout's ranks GPU ``gpu`` (its rank now) serves: the one it stands in for first."""
        if self.gpus <= self.layout.world:
            return tuple(range(gpu, self.layout.world, self.gpus))
        return (gpu // self.parts,)

    def describe(self) -> str:
        w, n = self.layout.world, self.gpus
        if not self.changed:
            return f"{n} GPU{'s' if n > 1 else ''}, {self.gpu_batch} images each a step"
        how = (
            f"{self.serves} micro-batches of {self.gpu_batch} images a step on each GPU, one for each rank of the run "
            "it stands in for"
            if self.serves > 1
            else f"each rank's {self.layout.rank_batch} images a step split over {self.parts} GPUs, "
            f"{self.gpu_batch} on each"
        )
        return f"world {w} -> {n} GPU{'s' if n > 1 else ''}: {how} ({self.layout.batch} images a step, as before)"


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
