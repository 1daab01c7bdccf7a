"""A run's layout on another number of GPUs: the images of each step and of the epoch's rest, whatever the GPUs.

The index math is checked against torch's own ``DistributedSampler`` and as a property over every size of data set,
number of ranks, batch and consumed step; the sampler that stands in for the loader's ``BatchSampler`` against it.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rocm_yolo.errors import UsageError
from rocm_yolo.patches.saves import loop_position
from rocm_yolo.policy.placement import fits, gpu_counts_that_fit, relayout
from rocm_yolo.run.devices import Layout, Relayout
from rocm_yolo.trainer.midepoch.relayout import (
    RelaidBatches,
    micro_batches,
    nominal_accumulate,
    padded,
    rank_step,
    remaining,
    steps,
)


@pytest.mark.parametrize("n, world, epoch", [(16, 2, 0), (17, 4, 3), (5, 8, 1), (64, 3, 2)])
def test_the_order_is_torchs_distributed_sampler(n, world, epoch):
    g = torch.Generator()
    g.manual_seed(7 + epoch)
    order = torch.randperm(n, generator=g).tolist()
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        assert list(sampler) == padded(order, world)[rank::world]


def other_worlds(layout: Layout) -> list[int]:
    return [g for g in gpu_counts_that_fit(layout, 4 * layout.world) if g != layout.world] or [layout.world]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 6),
    rank_batch=st.integers(1, 8),
    pick=st.integers(0, 1000),
    done=st.integers(0, 1000),
)
def test_each_step_and_the_rest_of_the_epoch_are_the_runs_own_whatever_the_gpus(n, world, rank_batch, pick, done):
    layout = Layout(world, rank_batch)
    worlds = other_worlds(layout)
    relaid = Relayout(layout, worlds[pick % len(worlds)])
    order = list(range(100, 100 + n))[::-1]  # any permutation: the math never looks at the values
    total = steps(n, layout)
    done = done % (total + 1)
    trained: Counter = Counter()
    for step in range(done, total):
        want = Counter(i for r in range(world) for i in rank_step(order, layout, r, step))
        got = [b for gpu in range(relaid.gpus) for b in micro_batches(order, relaid, gpu, step)]
        assert all(len(b) <= relaid.gpu_batch for b in got)  # no GPU's batch grows
        assert all(b for b in got)  # no GPU idles at a step (DDP would wait for it)
        if relaid.parts == 1 or all(len(rank_step(order, layout, r, step)) >= relaid.parts for r in range(world)):
            assert Counter(i for b in got for i in b) == want  # the step's images, as the run's ranks had them
        else:  # a short last batch split over more GPUs than it has images: the spare GPUs get a repeat
            assert set(i for b in got for i in b) == set(want)
        trained += want
        if relaid.serves > 1:  # fewer GPUs: each micro-batch is a rank's, so BatchNorm sees the same batches
            for gpu in range(relaid.gpus):
                mine = micro_batches(order, relaid, gpu, step)
                assert mine == [rank_step(order, layout, r, step) for r in relaid.ranks_of(gpu)]
                assert relaid.ranks_of(gpu)[0] == gpu  # it stands in for its own rank first
    # after `done` steps the rest is exactly the padded permutation from position world * rank_batch * done on
    assert trained == Counter(padded(order, world)[layout.batch * done :])
    left = remaining(order, layout, done)
    assert set(left) | set(padded(order, world)[: layout.batch * done]) == set(order)
    assert not set(left) & set(order[: layout.batch * done])


@pytest.mark.parametrize(
    "layout, gpus, serves, parts, gpu_batch",
    [
        (Layout(2, 8), 1, 2, 1, 8),
        (Layout(4, 4), 2, 2, 1, 4),
        (Layout(1, 8), 2, 1, 2, 4),
        (Layout(2, 8), 4, 1, 2, 4),
        (Layout(2, 8), 2, 1, 1, 8),
    ],
)
def test_a_gpu_never_takes_more_than_the_runs_rank_did(layout, gpus, serves, parts, gpu_batch):
    relaid = relayout(layout, gpus)
    assert (relaid.serves, relaid.parts, relaid.gpu_batch) == (serves, parts, gpu_batch)
    assert relaid.train_batch // gpus == gpu_batch  # Ultralytics' per-rank share: batch // world_size
    assert relaid.gpus * relaid.serves * relaid.gpu_batch == layout.batch  # each step's images kept


def test_counts_that_cannot_keep_each_step_are_refused_naming_those_that_can():
    with pytest.raises(UsageError) as caught:
        relayout(Layout(4, 4), 3, "--device 0,1,2")
    message = str(caught.value)
    assert message.startswith("--device 0,1,2: ") and "\n" not in message
    assert "resume on 1, 2, 4 or 8 GPUs" in message and "batch=" in message
    assert not fits(Layout(1, 6), 4) and fits(Layout(1, 6), 3) and fits(Layout(1, 6), 6)
    assert Layout.of(16, 2) == Layout(2, 8) and Layout.of(-1, 1) is None and Layout.of(0.5, 1) is None


def test_ultralytics_accumulate_is_the_runs_not_this_attempts():
    args = SimpleNamespace(nbs=64, time=None)
    layout = Layout(2, 8)
    # the run: batch 16, accumulate round(64/16) = 4; on one GPU Ultralytics would compute round(64/8) = 8
    assert nominal_accumulate(layout, args, batches=4, epochs=3) == 4
    assert nominal_accumulate(layout, args, batches=1, epochs=2) == 2  # capped at the run's batches, as Ultralytics
    assert nominal_accumulate(Layout(8, 16), args, batches=100, epochs=1) == 1


class Loader(SimpleNamespace):
    """What ``install`` finds of Ultralytics' train loader: _RepeatSampler(BatchSampler(sampler)), a data set."""


def test_the_sampler_yields_a_gpus_micro_batches_and_resumes_inside_the_epoch():
    n, layout = 20, Layout(2, 4)
    relaid = Relayout(layout, 1)
    sampler = RelaidBatches(n, relaid, 0, seed=0, generator=torch.Generator())
    sampler.set_epoch(3)
    whole = list(sampler)
    g = torch.Generator()
    g.manual_seed(3)
    order = torch.randperm(n, generator=g).tolist()
    assert whole == [b for s in range(steps(n, layout)) for b in micro_batches(order, relaid, 0, s)]
    assert sampler.state_of(0) == {"epoch": 3} and len(sampler) == 3
    sampler.set_epoch(5)
    sampler.resume_next_pass({"epoch": 3}, skip=2 * layout.rank_batch)  # two steps of a rank done
    assert list(sampler) == whole[2 * relaid.serves :]
    # a new global batch: the rest of epoch 3 after one step of the old layout, over 1 GPU of 6
    new = Relayout(Layout(1, 6), 1)
    rest = RelaidBatches(n, new, 0, seed=0, generator=torch.Generator())
    count = rest.resume_rest({"epoch": 3}, layout, done=1)
    left = list(rest)
    assert sum(left, []) == order[layout.batch :] and count == len(left) == 2 and len(left[0]) == 6
    assert rest.state_of(0) == {"epoch": 3, "order": order[layout.batch :]}


def test_a_step_of_micro_batches_is_one_item_of_the_training_loop():
    class Infinite:
        """Ultralytics' InfiniteDataLoader: len() batches an epoch, from one endless iterator."""

        def __init__(self):
            self.it = iter({"im_file": [f"{i}.jpg"], "i": i} for i in range(1000))

        def __len__(self):
            return 3

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.it)

    loader = Infinite()
    loop_position.group(loader, 2)
    try:
        first = list(loop_position._enumerate(loader))
        loop_position.arm(loader, 1, 2)
        second = list(loop_position._enumerate(loader))
    finally:
        loop_position.group(None, 1)
        loop_position.disarm()
    assert [i for i, _ in first] == [0, 1, 2] and [b["i"] for _, b in first] == [0, 2, 4]
    assert [b.rest[0]["i"] for _, b in first] == [1, 3, 5] and first[0][1].files() == ["0.jpg", "1.jpg"]
    assert [i for i, _ in second] == [1, 2] and [b["i"] for _, b in second] == [6, 8]
