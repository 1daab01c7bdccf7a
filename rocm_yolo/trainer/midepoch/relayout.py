"""A run trained on another number of GPUs than it started on, with each step's images kept: the sample order
laid over the run's own ranks, micro-batches on each GPU, Ultralytics' counters in the run's units.

The run's :class:`~rocm_yolo.run.devices.Layout` (``world`` ranks of ``rank_batch`` images) fixes everything: torch's
``DistributedSampler`` pads each epoch's permutation (``seed + epoch``) to a multiple of ``world`` and gives rank
``r`` every ``world``-th index from ``r``, so after ``i`` steps the images done are exactly the first
``world * rank_batch * i`` positions of the padded permutation, whatever GPUs trained them (one GPU: the
permutation a seeded generator draws, unpadded). :func:`rank_step` is the layout rank's batch at a step,
:func:`micro_batches` what one GPU of a :class:`~rocm_yolo.run.devices.Relayout` trains at that step, and
:func:`remaining` what an epoch has left when a new global batch is given on purpose.

:class:`RelaidBatches` stands in for the train loader's ``BatchSampler`` (inside Ultralytics' ``_RepeatSampler``)
and yields each GPU's micro-batches, one ``BatchSampler`` item each; it records what fixed each pass, as
:class:`~rocm_yolo.trainer.midepoch.sample_order.PassSampler` does, so mid-epoch checkpoints and resumes
work as on the run's own GPUs. :class:`Relaid` (Ultralytics callbacks) groups a step's micro-batches into one item
of the training loop (:func:`rocm_yolo.patches.saves.loop_position.group`), trains the ones before the last in the
model's forward (gradients accumulated locally under DDP's ``no_sync``, each BatchNorm's running statistics kept as
the rank it stands in for had them), and sets Ultralytics' ``accumulate`` to the run's own.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Sequence

import torch

from rocm_yolo.patches.saves import loop_position
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.devices import Layout, Relayout

# ----------------------------------------------------------------------------------------------- the index math


def padded(order: Sequence[int], world: int) -> list[int]:
    """``order`` padded as torch's ``DistributedSampler`` pads it (``drop_last=False``): with its own first indices
    to a multiple of ``world``."""
    order = list(order)
    if world <= 1 or not order:
        return order
    total = math.ceil(len(order) / world) * world
    pad = total - len(order)
    return order + (order * math.ceil(pad / len(order)))[:pad]


def steps(n: int, layout: Layout) -> int:
    """Steps in an epoch of ``n`` images: each rank's share in batches of ``rank_batch`` (the last one may be short)."""
    return math.ceil(math.ceil(n / layout.world) / layout.rank_batch) if n else 0


def rank_step(order: Sequence[int], layout: Layout, rank: int, step: int) -> list[int]:
    """The batch of the layout's rank ``rank`` at ``step`` of the epoch whose permutation is ``order``."""
    share = padded(order, layout.world)[rank :: layout.world]
    return share[step * layout.rank_batch : (step + 1) * layout.rank_batch]


def split(batch: list[int], parts: int, part: int) -> list[int]:
    """Part ``part`` of ``batch`` cut into ``parts`` as even as can be (a full batch: ``len // parts`` each); a batch
    with fewer images than parts gives the rest a repeat, as ``DistributedSampler`` pads (no GPU idles at a step)."""
    if parts <= 1:
        return list(batch)
    if len(batch) < parts:
        return [batch[part % len(batch)]] if batch else []
    size, extra = divmod(len(batch), parts)
    start = part * size + min(part, extra)
    return batch[start : start + size + (part < extra)]


def micro_batches(order: Sequence[int], relaid: Relayout, gpu: int, step: int) -> list[list[int]]:
    """What GPU ``gpu`` trains at ``step``: a micro-batch for each of the layout's ranks it serves (the one it
    stands in for first), or its part of one."""
    parts, part = relaid.parts, gpu % relaid.parts
    return [split(rank_step(order, relaid.layout, r, step), parts, part) for r in relaid.ranks_of(gpu)]


def remaining(order: Sequence[int], layout: Layout, done: int) -> list[int]:
    """The images an epoch has left after ``done`` steps of ``layout``: its permutation from position
    ``world * rank_batch * done`` on (the padding repeats images already among the first)."""
    return list(order)[min(layout.batch * done, len(order)) :]


# ----------------------------------------------------------------------------------------------- the sampler


class RelaidBatches:
    """The train loader's batch sampler for a :class:`Relayout`: each pass one epoch, laid over the run's ranks.

    The epoch's permutation is the one the run's own sampler would draw: on one GPU (``world`` 1) from the loader's
    seeded generator (``RandomSampler``), on several from ``seed + epoch`` (``DistributedSampler``; the epoch is
    the one Ultralytics' loop sets on the loader's sampler, or :meth:`set_epoch`'s where it has none). A pass can
    also be the rest of an epoch a new global batch continues (:meth:`resume_rest`).
    """

    def __init__(self, n: int, relaid: Relayout, gpu: int, *, seed: int, generator, epoch_source=None):
        self.n = n
        self.relaid = relaid
        self.gpu = gpu
        self.layout = relaid.layout
        self.batch_size = relaid.layout.rank_batch  # a rank's batch, as a mid-epoch checkpoint records it
        self.drop_last = False
        self.seed = seed
        self.generator = generator if relaid.layout.world == 1 else None
        self.distributed = relaid.layout.world > 1
        self.epoch = 0
        self.epoch_source = epoch_source or self  # a DistributedSampler that Ultralytics' loop sets, or this
        self.started = 0
        self.states: dict[int, object] = {}
        self._resume: tuple | None = None

    def __len__(self) -> int:
        return steps(self.n, self.layout)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    # the PassSampler interface (sample_order.TrainOrder, the mid-epoch save and resume) -------------------------
    def resume_next_pass(self, state: object, skip: int, on_start: Callable[[], None] | None = None) -> None:
        """Start the next pass from ``state`` (a generator state, or ``{"epoch": E}``) after ``skip`` indices of a
        rank's share, that is ``skip // rank_batch`` steps."""
        self._resume = (state, skip // self.layout.rank_batch, None, on_start)

    def resume_rest(self, state: object, old: Layout, done: int, on_start: Callable[[], None] | None = None) -> int:
        """Make the next pass the rest of the epoch ``state`` fixed under layout ``old`` after ``done`` of its steps,
        laid over this layout; returns its steps."""
        if isinstance(state, torch.Tensor) and self.generator is not None:
            self.generator.set_state(state)  # later passes draw from where the epoch's own pass would leave it
            order = self._draw()
        else:
            order = self._order(state)
        rest = remaining(order, old, done)
        epoch = state.get("epoch", self.epoch) if isinstance(state, dict) else self.epoch
        self._resume = ({"epoch": int(epoch), "order": rest}, 0, rest, on_start)
        return steps(len(rest), self.layout)

    def state_of(self, number: int) -> object:
        return self.states.get(number)

    def forget_before(self, number: int) -> None:
        for old in [k for k in self.states if k < number]:
            del self.states[old]

    # the passes ---------------------------------------------------------------------------------------------
    def _order(self, state: object) -> list[int]:
        """The permutation ``state`` fixes: an explicit one (the rest of an epoch), ``seed + epoch``'s
        (``DistributedSampler``), or the one a generator in ``state`` draws (one GPU's ``RandomSampler``)."""
        if isinstance(state, dict) and "order" in state:
            return [int(x) for x in state["order"]]
        g = torch.Generator()
        if isinstance(state, torch.Tensor):
            g.set_state(state)
        else:
            g.manual_seed(self.seed + int(state["epoch"]))
        return torch.randperm(self.n, generator=g).tolist()

    def _draw(self) -> list[int]:
        """One GPU's pass, as ``RandomSampler`` draws it from the loader's generator: a permutation, and a second
        one it cuts to nothing (``num_samples % n``) when the pass ends."""
        order = torch.randperm(self.n, generator=self.generator).tolist()
        torch.randperm(self.n, generator=self.generator)
        return order

    def __iter__(self):
        resume, self._resume = self._resume, None
        start, order = 0, None
        if resume is not None:
            state, start, order, on_start = resume
            if isinstance(state, torch.Tensor) and self.generator is not None:
                self.generator.set_state(state)
            elif isinstance(state, dict):
                self.set_epoch(int(state["epoch"]))
            if on_start is not None:
                on_start()
        if order is not None:
            state = resume[0]
        elif self.generator is not None:
            state = self.generator.get_state()
            order = self._draw()
        else:
            state = {"epoch": int(self.epoch_source.epoch)}
            order = self._order(state)
        number, self.started = self.started, self.started + 1
        self.states[number] = state
        for step in range(start, steps(len(order), self.layout)):
            yield from micro_batches(order, self.relaid, self.gpu, step)


def install(loader, relaid: Relayout, gpu: int, seed: int) -> RelaidBatches | None:
    """Put a :class:`RelaidBatches` into ``loader``'s ``_RepeatSampler``; None if the loader is not Ultralytics'
    shuffled ``InfiniteDataLoader`` before its first batch (its order could not be laid anew)."""
    repeat = getattr(loader, "batch_sampler", None)
    batches = getattr(repeat, "sampler", None)
    if isinstance(batches, RelaidBatches):
        return batches
    inner = getattr(batches, "sampler", None)
    if inner is None or getattr(batches, "drop_last", True) or getattr(loader, "iterator", None) is not None:
        return None
    generator = getattr(inner, "generator", None)
    shuffled = isinstance(generator, torch.Generator) or getattr(inner, "shuffle", False)
    if not shuffled:
        return None
    source = inner if hasattr(inner, "set_epoch") and hasattr(inner, "epoch") else None
    if generator is None:  # several GPUs now, one before: the one-GPU loader's generator, seeded as Ultralytics does
        generator = torch.Generator()
        generator.manual_seed((6148914691236517205 - 1 + seed) % (1 << 64))
    sampler = RelaidBatches(len(loader.dataset), relaid, gpu, seed=seed, generator=generator, epoch_source=source)
    repeat.sampler = sampler
    return sampler


# ----------------------------------------------------------------------------------------------- the training step


@contextlib.contextmanager
def norm_statistics_kept(model):
    """BatchNorm's running statistics as they were before the block (a micro-batch of another rank trains)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    kept = [[b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, saved in zip(norms, kept):
                live = [b for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
                for buffer, value in zip(live, saved):
                    buffer.copy_(value)


def nominal_accumulate(layout: Layout, args, batches: int, epochs: int) -> int:
    """Ultralytics' ``accumulate`` for the run's own global batch (``_build_train_pipeline``), capped as it caps it."""
    accumulate = max(round(args.nbs / layout.batch), 1)
    if not getattr(args, "time", None):
        accumulate = min(accumulate, batches * epochs)
    return accumulate


class Relaid:
    """Ultralytics callbacks for a run trained on another number of GPUs (a :class:`Relayout`)."""

    def __init__(self, relaid: Relayout, order, log: RunLog):
        self.relaid = relaid
        self.order = order  # sample_order.TrainOrder: it installs the sampler
        self.log = log
        self.sampler: RelaidBatches | None = None
        self._forward = None

    def on_pretrain_routine_end(self, trainer) -> None:
        """After Ultralytics built the loaders and computed its ``accumulate`` for this attempt's batch (and after
        the mid-epoch resume's callback, which installs the sampler)."""
        loader = trainer.train_loader
        sampler = self.order.sampler if self.order.supported else None
        self.sampler = sampler if isinstance(sampler, RelaidBatches) and sampler.relaid == self.relaid else None
        if self.sampler is None:
            self.log.event(
                "relayout_off",
                f"the run's {self.relaid.layout.batch} images a step cannot be laid over {self.relaid.gpus} GPUs "
                f"here (mid-epoch checkpoints are off); Ultralytics' own split of batch={trainer.batch_size} instead",
            )
            return
        if self.relaid.serves > 1:
            loop_position.group(loader, self.relaid.serves)
        trainer.accumulate = nominal_accumulate(self.relaid.layout, trainer.args, len(loader), trainer.epochs)
        self.log.event(
            "relayout",
            self.relaid.describe() + f"; accumulate {trainer.accumulate} as the run's",
            world_from=self.relaid.layout.world,
            world_to=self.relaid.gpus,
            gpu_batch=self.relaid.gpu_batch,
            micro_batches=self.relaid.serves,
            accumulate=trainer.accumulate,
        )

    def on_train_start(self, trainer) -> None:
        if self.sampler is not None and self.relaid.serves > 1:
            self._install_forward(trainer)

    def on_train_epoch_start(self, trainer) -> None:
        if self.sampler is not None and self.sampler.epoch_source is self.sampler:
            self.sampler.set_epoch(trainer.epoch)  # one GPU: Ultralytics' loop sets no sampler's epoch

    def on_train_end(self, trainer) -> None:
        loop_position.group(None, 1)
        model = getattr(trainer, "model", None)
        if model is not None and self._forward is not None and model.__dict__.get("forward") is self._forward:
            del model.forward
        self._forward = None

    def _install_forward(self, trainer) -> None:
        """The model's forward trains a step's micro-batches before its first, whose loss the loop backpropagates."""
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.model
        original = model.forward
        ddp = isinstance(model, DistributedDataParallel)
        module = model.module if ddp else model
        prepare = trainer.preprocess_batch

        def forward(batch, *args, **kwargs):
            for raw in getattr(batch, "rest", ()):
                part = prepare(raw)
                with model.no_sync() if ddp else contextlib.nullcontext(), norm_statistics_kept(module):
                    loss, _ = original(part, *args, **kwargs)
                    loss = loss.sum() * (trainer.world_size if ddp else 1)
                    with torch.autocast(trainer.device.type, enabled=False):
                        trainer.scaler.scale(loss).backward()
                del part, loss
            return original(batch, *args, **kwargs)

        model.forward = self._forward = forward
