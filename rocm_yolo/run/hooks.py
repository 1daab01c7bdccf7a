"""The one door into :mod:`rocm_yolo.testing`: fault injection and the batch recorder, for tests and benchmarks.

Production code calls one of these functions at each hook site. Each reads its environment
variable and returns at once when it is unset, so :mod:`rocm_yolo.testing` is imported only
in a process that was asked for a fault or a recording (the fork server, and so every
DataLoader worker, never imports it otherwise). The variables and their grammar are in
CONTRIBUTING.md and :mod:`rocm_yolo.testing.faults`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable

FAULT_ENV = "ROCM_YOLO_FAULT"  # KIND[@WHERE][,KIND[@WHERE]...]: real faults, each once per run directory
RECORD_ENV = "ROCM_YOLO_RECORD_BATCHES"  # FILE: one JSON line per training batch (attempt, epoch, batch, files)


def _faults():
    if not os.environ.get(FAULT_ENV):
        return None
    from rocm_yolo.testing import faults

    return faults


def trainer_callbacks(paths, attempt: int) -> list:
    """Callback owners for the trainer (fault injector, batch recorder); [] unless asked for."""
    owners = []
    faults = _faults()
    if faults is not None:
        owners.append(faults.Injector(faults.active(), paths))
    if os.environ.get(RECORD_ENV):
        from rocm_yolo.testing.recorder import BatchRecorder

        owners.append(BatchRecorder(os.environ[RECORD_ENV], attempt))
    return owners


def checkpoint_writer(paths, where: tuple[int, int]) -> Callable | None:
    """``save-kill``: a writer that kills the trainer halfway through this mid-epoch checkpoint, or None."""
    faults = _faults()
    return None if faults is None else faults.save_kill_writer(paths, where)


def final_save(name: str, paths):
    """Around the end of training's rewrite of ``name``: tests stop the run halfway through it; else nothing."""
    faults = _faults()
    return contextlib.nullcontext() if faults is None else faults.final_save(name, paths)


def arm_worker(dataset, run_dir) -> None:
    """In a DataLoader worker: ``worker-hang`` makes its ``__getitem__`` block once the run's trigger exists."""
    faults = _faults()
    if faults is not None:
        faults.arm_worker(dataset, run_dir)


def worker_hang_check(run_dir) -> Callable[[], None] | None:
    """``worker-hang`` for loader threads: a check that blocks its caller once the trigger exists; None if unset."""
    faults = _faults()
    return None if faults is None else faults.worker_hang_check(run_dir)


def conv_fault(strategy: str) -> None:
    """In the conv self-test child: imitate a GPU failure of ``strategy`` as it starts, if asked."""
    faults = _faults()
    if faults is not None:
        faults.conv_fault(strategy)


def conv_installed(strategy: str) -> None:
    """In the conv self-test child, after ``strategy`` is installed: make it slow or fail in fp16, if asked."""
    faults = _faults()
    if faults is not None:
        faults.wrap_conv(strategy)
