"""A rank of a multi-GPU run: a training child started by ``torch.distributed.run`` (see :mod:`.launcher`).

It trains as a one-GPU child does, with three differences:

- its heartbeat lines go into the launcher's FIFO (:func:`reporting` opens it), and its last
  line says its exit code;
- above rank 0 it leaves the run's files to rank 0: rank 0 writes the checkpoints, the
  heartbeat file ``heartbeat.json`` and the header; the others write
  ``heartbeat-rankN.json`` and prefix their lines with their rank;
- above rank 0 it runs ``on_pretrain_routine_start`` itself (:func:`trainer_class`):
  Ultralytics runs that callback on rank 0 only, and rocm-yolo's run hooks set the loaders up
  in it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

from rocm_yolo import environment, errors
from rocm_yolo.run.heartbeat import exit_line


@contextlib.contextmanager
def reporting(rank: int) -> Iterator[Callable[[int], int]]:
    """Send this rank's heartbeats to the launcher; at the end, its exit code (``report(code)`` records it)."""
    fd = None
    fifo = os.environ.get(environment.HEARTBEAT_FIFO)
    if fifo:
        try:
            fd = os.open(fifo, os.O_WRONLY)  # the launcher holds the read end open
            os.environ[environment.HEARTBEAT_FD] = str(fd)  # the heartbeat writer's pipe
        except OSError:
            fd = None
    code = [errors.FAILED]

    def report(value: int) -> int:
        code[0] = value
        return value

    try:
        yield report
    except SystemExit as e:  # SIGTERM from torch.distributed.run or the supervisor
        code[0] = e.code if isinstance(e.code, int) else errors.FAILED
        raise
    finally:
        if fd is not None:
            try:
                os.write(fd, (exit_line(rank, code[0]) + "\n").encode())
            except OSError:
                pass


def trainer_class(model):
    """The model's trainer class, running ``on_pretrain_routine_start`` on a rank above 0 as well."""
    base = model.task_map[model.task]["trainer"]

    class RankTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.run_callbacks("on_pretrain_routine_start")  # Ultralytics: on rank 0 only (RANK in {-1, 0})

    RankTrainer.__name__ = RankTrainer.__qualname__ = base.__name__
    return RankTrainer
