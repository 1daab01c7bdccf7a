"""Datasets and worker functions for the DataLoader patch's tests with real workers.

They live in a module of their own (not a test module) so that fork-server workers find them
by name, as they find a user's. :mod:`loader_heavy_import` stands for a dataset module whose
import is slow, :mod:`loader_thread_import` for one that starts a thread: each records who imported it.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch
from torch.utils.data import Dataset


class Sleepy(Dataset):
    def __init__(self, seconds: float):
        self.seconds = seconds

    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return i


class Offset(Dataset):
    """Items ``start + i``: ``start`` changed between epochs is what the next epoch's workers see."""

    def __init__(self):
        self.start = 0

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.start + i


class WorkerSeed(Dataset):
    """Each item is its worker's seed (torch derives it from the loader's base seed)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.01)  # both workers take items
        return torch.utils.data.get_worker_info().seed


class Crash(Dataset):
    """Its worker dies of a signal: ``how`` is "segfault" or a signal number the worker sends itself."""

    def __init__(self, how: str | int):
        self.how = how

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 8:
            if self.how == "segfault":
                ctypes.string_at(0)
            os.kill(os.getpid(), int(self.how))
        return i


def record_import(name: str) -> None:
    """Leave the importing process's pid in the file ``name`` beside ``$LOADER_IMPORTS_LOG`` (called at import)."""
    log = os.environ.get("LOADER_IMPORTS_LOG")
    if log:
        with open(os.path.join(os.path.dirname(log), name), "a") as f:
            f.write(f"{os.getpid()}\n")


def record_init(worker_id: int) -> None:
    """A module-level ``worker_init_fn`` that leaves one line per call in the dataset's ``log``."""
    info = torch.utils.data.get_worker_info()
    with open(info.dataset.log, "a") as f:
        f.write(f"{os.getpid()} {worker_id}\n")


class Logged(Offset):
    def __init__(self, log: str):
        super().__init__()
        self.log = log
