"""The order of the training samples: recorded for every pass, replayed from inside a pass.

Ultralytics' train loader is an ``InfiniteDataLoader`` whose batch sampler is
``_RepeatSampler(BatchSampler(RandomSampler(generator=g)))``: each pass over the data set is
one ``iter()`` of the ``BatchSampler``, which makes one ``iter()`` of the ``RandomSampler``,
whose first draw is a ``randperm`` from the loader's seeded generator ``g``. So the state of
``g`` when a pass starts fixes that pass's order.

:class:`PassSampler` takes the ``RandomSampler``'s place inside the ``BatchSampler`` (on the
train loader only, before its lazy iterator exists). It records ``g``'s state at the start of
every pass, and can be told to start its next pass from a saved state with the first ``skip``
indices left out: the ``BatchSampler`` then makes the remaining batches of that pass, the
data set is never asked for the skipped samples, and ``g`` ends the pass in the same state as
in an uninterrupted run, so later passes match too. It runs in the trainer process (the
DataLoader's iterator draws indices there, also with worker processes).

On several GPUs the sampler is torch's ``DistributedSampler``: each pass is the rank's share
of an order drawn from the seed and the sampler's ``epoch`` (``set_epoch``), so the
``epoch`` value at the start of the pass fixes it. Every rank replays its own share from
the value rank 0 saved, and skips the indices of the batches it has done.

On another number of GPUs than the run's own (a :class:`~rocm_yolo.run.devices.Relayout`), the train loader's
``BatchSampler`` itself is replaced (:class:`~rocm_yolo.trainer.midepoch.relayout.RelaidBatches`), which
offers the same interface.

Which pass an epoch trains is the caller's business (:class:`PassTracker`): DataLoader
workers prefetch, so the iterator may start the next pass before the epoch ends, and a new
iterator (the first epoch, ``reset()`` when mosaic closes, fresh workers under ``safe``)
starts a new pass.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Callable

import torch

from rocm_yolo.patches.saves import loop_position
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.devices import Relayout

if TYPE_CHECKING:
    from rocm_yolo.trainer.midepoch.relayout import RelaidBatches


class PassSampler:
    """Stands in for a ``BatchSampler``'s sampler: one ``__iter__`` is one pass."""

    def __init__(self, inner):
        self.inner = inner
        self.generator = getattr(inner, "generator", None)
        if not isinstance(self.generator, torch.Generator):
            self.generator = None
        # DDP: a DistributedSampler draws each pass from seed + its ``epoch`` (set_epoch), its rank's share of it
        self.distributed = self.generator is None and hasattr(inner, "set_epoch") and hasattr(inner, "epoch")
        self.started = 0  # passes started so far
        self.states: dict[int, object] = {}  # what fixed each pass not forgotten: generator state, or {"epoch": E}
        self._resume: tuple | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def resume_next_pass(self, state: object, skip: int, on_start: Callable[[], None] | None = None):
        """Start the next pass from ``state`` (a generator state, or a DistributedSampler's ``{"epoch": E}``;
        None: as it comes), without its first ``skip`` indices."""
        self._resume = (state, skip, on_start)

    def __iter__(self):
        resume, self._resume = self._resume, None
        skip = 0
        if resume is not None:
            state, skip, on_start = resume
            if isinstance(state, torch.Tensor) and self.generator is not None:
                self.generator.set_state(state)
            elif isinstance(state, dict) and self.distributed:
                self.inner.set_epoch(int(state["epoch"]))
            if on_start is not None:
                on_start()
        number = self.started
        self.started += 1
        self.states[number] = self._state()
        indices = iter(self.inner)
        if skip:
            indices = itertools.islice(indices, skip, None)
        yield from indices

    def _state(self) -> object:
        if self.generator is not None:
            return self.generator.get_state()
        return {"epoch": int(self.inner.epoch)} if self.distributed else None

    def state_of(self, number: int) -> object:
        return self.states.get(number)

    def forget_before(self, number: int) -> None:
        for old in [k for k in self.states if k < number]:
            del self.states[old]


def install(loader) -> PassSampler | None:
    """Put a :class:`PassSampler` into ``loader``'s batch sampler; None if its structure is not the expected one
    or its iterator already exists (passes would have been drawn unrecorded)."""
    repeat = getattr(loader, "batch_sampler", None)
    batches = getattr(repeat, "sampler", None)
    inner = getattr(batches, "sampler", None)
    if inner is None or not hasattr(batches, "batch_size"):
        return None
    if isinstance(inner, PassSampler):
        return inner
    if getattr(loader, "iterator", None) is not None:
        return None
    sampler = PassSampler(inner)
    batches.sampler = sampler
    return sampler


def batch_size(loader) -> int:
    return int(loader.batch_sampler.sampler.batch_size)


class PassTracker:
    """Which pass of a :class:`PassSampler` each epoch trains.

    Each epoch consumes exactly one pass. An epoch that starts on a new iterator trains the
    first pass started after the epoch began (:meth:`epoch_started` marks it); an epoch on the
    same iterator as the one before trains the pass after that one's.
    """

    def __init__(self, sampler: PassSampler):
        self.sampler = sampler
        self.mark = 0
        self.iterator = None
        self.current: int | None = None

    def epoch_started(self) -> None:
        self.mark = self.sampler.started

    def first_batch(self, iterator) -> int:
        """Call at the first batch of an epoch, with the loader's iterator; the epoch's pass number."""
        if self.iterator is None or iterator is not self.iterator() or self.current is None:
            self.current = self.mark
            self.iterator = weakref.ref(iterator) if iterator is not None else None
        else:
            self.current += 1
        self.sampler.forget_before(self.current)
        return self.current


class TrainOrder:
    """The train loader's sample order in this process, shared by mid-epoch save and resume.

    It also is the feature's switch: :meth:`off` turns writing and continuing off for the rest
    of the process, and says why once.
    """

    def __init__(self, log: RunLog, relaid: Relayout | None = None, gpu: int = 0):
        self.log = log
        self.supported = True  # this Ultralytics can be continued inside an epoch (ultralytics_rules.compat)
        self.loader = None
        self.sampler: PassSampler | RelaidBatches | None = None
        self.tracker: PassTracker | None = None
        self.relaid = relaid  # the run's layout on this attempt's GPUs (None: the run's layout is not known)
        self.lay_out = relaid is not None and relaid.changed  # the order laid over the run's ranks: RelaidBatches
        self.gpu = gpu  # this process's rank (0 on one GPU)
        self.seed = 0  # Ultralytics' seed of the run (trainer.args.seed): DistributedSampler's

    def lay_anew(self, relaid: Relayout) -> None:
        """Lay the order out with :class:`RelaidBatches` from the next :meth:`follow` on (an epoch continued under a
        new global batch needs it, on the run's own GPUs too)."""
        self.relaid, self.lay_out = relaid, True

    def off(self, why: str | None) -> None:
        """Mid-epoch checkpoints are off in this process; ``why`` is said once (None: already said elsewhere)."""
        if self.supported:
            self.supported = False
            loop_position.disarm()
            if why:
                self.log.event("mid_epoch_off", f"mid-epoch checkpoints are off: {why}", reason=why)

    def follow(self, loader) -> bool:
        """Record ``loader``'s sample order (again when Ultralytics rebuilt it); False when the feature is off."""
        if self.supported and loader is not self.loader:
            self.loader = loader
            if self.lay_out:
                from rocm_yolo.trainer.midepoch import relayout

                self.sampler = relayout.install(loader, self.relaid, self.gpu, self.seed)
            else:
                self.sampler = install(loader)
            self.tracker = PassTracker(self.sampler) if self.sampler is not None else None
            if self.sampler is None:
                self.off(
                    "the train loader is not Ultralytics' shuffled InfiniteDataLoader(BatchSampler(sampler)) before "
                    "its first batch, so its sample order cannot be replayed"
                    + (" nor laid over the run's ranks" if self.lay_out else "")
                )
        return self.supported
