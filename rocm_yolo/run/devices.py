"""The GPUs of a run, read without torch: one GPU, or several (Ultralytics' DDP), and a rank's own number.

``--device 0,1`` trains on two GPUs: the supervisor starts the DDP launcher instead of the training
child (:func:`launches_ranks`), which starts one rank per GPU with ``torch.distributed.run``, as
Ultralytics does; each rank is a training child of its own (:mod:`rocm_yolo.ddp.launcher`). A rank
knows itself by the variables torch's launcher sets (:data:`rocm_yolo.environment.RANK` and its
neighbours). On more than one machine each node does the same (:mod:`.nodes`: the nodes and their
round).

A run keeps the :class:`Layout` it started with (its GPUs and each one's share of the batch); an attempt on another
number of GPUs trains it as a :class:`Relayout`: the same images each step, no GPU's batch grown. Which devices,
batches and layouts are refused is the policy's (:mod:`rocm_yolo.policy.placement`); here are the records that
travel in the spec, and what a process reads of its rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from rocm_yolo import environment

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


def gpu_ids(device: object) -> list[str]:
    """The GPU ids a ``device`` argument names (``"0,1"`` -> ``["0", "1"]``); [] for ``cpu``, ``mps``,
    auto (None, ``""``) and anything else that is not a list of ids."""
    named = devices_named(device)
    return named if named and all(x.isdigit() for x in named) else []


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
