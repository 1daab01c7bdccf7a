"""The order of the training samples: recorded for every pass, replayed inside a pass (real Ultralytics loaders)."""

from __future__ import annotations

import torch

from rocm_yolo.trainer.midepoch import sample_order


class Recording(torch.utils.data.Dataset):
    """Items are their own indices; ``asked`` records what the loader asked for (in this process)."""

    def __init__(self, n: int):
        self.n, self.asked = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.asked.append(index)
        return index


def loader(n=22, batch=4, workers=0):
    from ultralytics.data.build import build_dataloader

    return build_dataloader(Recording(n), batch=batch, workers=workers, shuffle=True, rank=-1)


def epoch(ld, count=None):
    """One epoch as Ultralytics' loop sees it: ``len(ld)`` batches (or ``count``) of the persistent iterator."""
    import itertools

    return [b.tolist() for b in itertools.islice(ld, count if count is not None else len(ld))]


def order_of(state, n, batch):
    g = torch.Generator()
    g.set_state(state)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i : i + batch] for i in range(0, n, batch)]


def test_a_pass_resumes_from_its_state_without_asking_for_the_batches_done():
    torch.manual_seed(0)
    a = loader()
    sampler = sample_order.install(a)
    assert sample_order.install(a) is sampler  # idempotent
    full = [epoch(a) for _ in range(3)]
    assert [order_of(sampler.state_of(k), 22, 4) for k in range(3)] == full  # the recorded states make the passes

    torch.manual_seed(1)  # another process: another seed, another generator
    b = loader()
    resumed = sample_order.install(b)
    called = []
    resumed.resume_next_pass(sampler.state_of(1), skip=2 * 4, on_start=lambda: called.append(True))
    rest = epoch(b, count=len(b) - 2)
    assert rest == full[1][2:] and called == [True]
    assert b.dataset.asked == [i for batch in full[1][2:] for i in batch]  # never asked for the first two batches
    assert epoch(b) == full[2]  # the next pass matches too
    assert len(b) == len(a) == 6  # batches per epoch unchanged


def test_the_tracker_finds_each_epochs_pass_despite_prefetch_and_resets():
    torch.manual_seed(0)
    ld = loader(workers=2)  # worker processes prefetch into the next pass
    sampler = sample_order.install(ld)
    tracker = sample_order.PassTracker(sampler)
    seen = []
    try:
        for e in range(4):
            if e == 2:
                ld.reset()  # as when mosaic closes: the pass drawn ahead is dropped
            tracker.epoch_started()
            batches = []
            for i, batch in enumerate(ld):
                if i == 0:
                    number = tracker.first_batch(ld.iterator)
                batches.append(batch.tolist())
            seen.append(number)
            assert order_of(sampler.state_of(number), 22, 4) == batches  # the state that made this epoch's pass
    finally:
        ld.close()
    assert seen[:2] == [0, 1] and seen[2] > 2 and seen[3] == seen[2] + 1  # the pass drawn ahead was dropped
