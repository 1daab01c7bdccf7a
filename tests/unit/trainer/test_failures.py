"""How the trainer names a failure: a dead DataLoader worker, named as torch names it."""

from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from rocm_yolo.patches.loaders import dataloader as patch


def test_a_worker_killed_while_handing_over_a_batch_is_named_in_the_crash():
    """A worker killed mid hand-over can surface as a bare ConnectionResetError; the crash names the worker."""
    import signal

    from rocm_yolo.trainer.training import name_dead_worker

    # forkserver, as rocm-yolo runs them: the workers are not this process's children (with fork, torch's
    # SIGCHLD handler would raise here first), so their exit status comes late, through the server
    loader = DataLoader(
        TensorDataset(torch.arange(64.0)),
        batch_size=4,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context="forkserver",
    )
    it = iter(loader)
    next(it)
    [worker] = it._workers
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert name_dead_worker(reset, [loader]) is reset  # all alive (after a 2 s look): the error as it was
    os.kill(worker.pid, signal.SIGKILL)
    assert patch.dead_workers([loader]) == [(worker.pid, -signal.SIGKILL)]
    named = name_dead_worker(reset, [loader])
    assert isinstance(named, RuntimeError) and named.__cause__ is reset
    assert (
        str(named) == f"DataLoader worker (pid(s) {worker.pid}) exited unexpectedly: pid {worker.pid} killed by SIGKILL"
    )
    other = ValueError("not a queue failure")
    assert name_dead_worker(other, [loader]) is other and name_dead_worker(reset, []) is reset
    del it
