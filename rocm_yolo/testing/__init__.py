"""For tests and benchmarks only: real faults on request, and a record of the samples each batch trained.

A plugin of :mod:`rocm_yolo.run.hooks`: a process loads it when ``ROCM_YOLO_PLUGINS=rocm_yolo.testing``
is set (:func:`environ` gives that with the variables it reads), and nothing in rocm-yolo imports it.
It answers the hook points with :mod:`.faults` (``ROCM_YOLO_FAULT``; the GPU's failures it imitates are
:mod:`.gpu_faults`) and :mod:`.recorder`
(``ROCM_YOLO_RECORD_BATCHES``); CONTRIBUTING.md describes both variables.
"""

from __future__ import annotations

import os

from rocm_yolo import environment


def environ(fault: str | None = None, record: str | os.PathLike | None = None) -> dict[str, str]:
    """The variables that ask a run for ``fault`` (``KIND[@WHERE],...``) and a batch record in ``record``."""
    out = {environment.PLUGINS: __name__}
    if fault:
        out[environment.FAULT] = fault
    if record:
        out[environment.RECORD_BATCHES] = str(record)
    return out


def trainer_callbacks(paths, attempt: int) -> list:
    owners = []
    if os.environ.get(environment.FAULT):
        from rocm_yolo.testing import faults

        owners.append(faults.Injector(faults.active(), paths))
    if os.environ.get(environment.RECORD_BATCHES):
        from rocm_yolo.testing.recorder import BatchRecorder

        owners.append(BatchRecorder(os.environ[environment.RECORD_BATCHES], attempt))
    return owners


def _faults():
    if not os.environ.get(environment.FAULT):
        return None
    from rocm_yolo.testing import faults

    return faults


def checkpoint_writer(paths, where: tuple[int, int]):
    faults = _faults()
    return None if faults is None else faults.save_kill_writer(paths, where)


def epoch_save_writer(path):
    faults = _faults()
    return None if faults is None else faults.epoch_save_writer(path)


def final_save(name: str, paths):
    import contextlib

    faults = _faults()
    return contextlib.nullcontext() if faults is None else faults.final_save(name, paths)


def arm_worker(dataset, run_dir) -> None:
    faults = _faults()
    if faults is not None:
        faults.arm_worker(dataset, run_dir)


def worker_hang_check(run_dir):
    faults = _faults()
    return None if faults is None else faults.worker_hang_check(run_dir)


def conv_fault(strategy: str) -> None:
    faults = _faults()
    if faults is not None:
        faults.conv_fault(strategy)


def conv_installed(strategy: str) -> None:
    faults = _faults()
    if faults is not None:
        faults.wrap_conv(strategy)
