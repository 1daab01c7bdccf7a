"""A rank of a multi-GPU run: a training child started by ``torch.distributed.run``, which the DDP launcher
started (:mod:`rocm_yolo.ddp.launcher`).

It trains as a one-GPU child does, with three differences:

- its heartbeat lines go into the launcher's FIFO (:func:`reporting` opens it; :mod:`rocm_yolo.ddp.relay`
  relays them), and its last line says its exit code;
- above rank 0 it leaves the run's files to rank 0: rank 0 writes the checkpoints, the
  heartbeat file ``heartbeat.json`` and the header; the others write
  ``heartbeat-rankN.json`` and prefix their lines with their rank;
- above rank 0 it runs ``on_pretrain_routine_start`` itself (:func:`trainer_class`):
  Ultralytics runs that callback on rank 0 only, and rocm-yolo's trainer settings set the loaders up
  in it.

On more than one machine three more, each at the narrowest point (:func:`trainer_class`,
:func:`agreed_resume`):

- **the world size is the global one.** Ultralytics counts the ids of ``device`` (this node's
  GPUs) and gives ``init_process_group``, the per-rank batch and the loss scale that count; a
  rank takes torch's ``WORLD_SIZE`` instead (ultralytics#22878: "Invalid rank requested");
- **one labels cache for all nodes.** Ultralytics builds each data set under
  ``torch_distributed_zero_first(LOCAL_RANK)``, so every node's local rank 0 would write the same
  ``.cache`` file on the shared storage at once. Global rank 0 builds first, the others after it;
- **one checkpoint for all nodes.** Each node's supervisor chose the checkpoint of its restart on
  its own, maybe while the other node's rank 0 was still saving. Every rank resumes from the newest
  valid one when it starts: then no rank of the old round writes any more, and a new one writes
  only after every rank has loaded.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator

from rocm_yolo import environment, errors
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import devices, weights
from rocm_yolo.run.heartbeat import exit_line, start_line
from rocm_yolo.run.spec import RunSpec


@contextlib.contextmanager
def reporting(rank: int) -> Iterator[Callable[[int], int]]:
    """Send this rank's heartbeats to the launcher; at the end, its exit code (``report(code)`` records it)."""
    fd = None
    fifo = os.environ.get(environment.HEARTBEAT_FIFO)
    if fifo:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NOFOLLOW)  # the launcher holds the read end open
            os.environ[environment.HEARTBEAT_FD] = str(fd)  # the heartbeat writer's pipe
        except OSError:
            fd = None
    if fd is not None:
        try:
            os.write(fd, (start_line(rank) + "\n").encode())  # this node's ranks run
        except OSError:
            pass
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


def trainer_class(model, nodes: int = 1):
    """The model's trainer class for a rank: the global world size, ``on_pretrain_routine_start`` on a rank above
    0 as well, and on more than one node (``nodes``) each data set built by global rank 0 first."""
    base = model.task_map[model.task]["trainer"]

    class RankTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            world = os.environ.get(environment.WORLD_SIZE, "")
            if world.isdigit() and int(world) > 1:
                self.world_size = int(world)  # Ultralytics: this node's device count
            if devices.rank():
                self.run_callbacks("on_pretrain_routine_start")  # Ultralytics: on rank 0 only (RANK in {-1, 0})

        def get_dataloader(self, *args, **kwargs):
            rank = kwargs.get("rank", args[2] if len(args) > 2 else 0)
            if nodes < 2 or rank == -1:  # one node, or a loader of rank 0 alone: no barrier to pair
                return super().get_dataloader(*args, **kwargs)
            return _global_rank_0_first(lambda: base.get_dataloader(self, *args, **kwargs))

    RankTrainer.__name__ = RankTrainer.__qualname__ = base.__name__
    return RankTrainer


def _global_rank_0_first(build: Callable):
    """``build()`` on global rank 0, then on the other ranks. Around Ultralytics' own ``torch_distributed_zero_first
    (LOCAL_RANK)`` inside ``build``, each rank calls one barrier more, so the barriers pair up: the other ranks
    wait in theirs while rank 0 builds (its own barrier after the build meets them), then each node's local rank 0
    finds the cache rank 0 wrote."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return build()

    def barrier() -> None:
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()

    first = dist.get_rank() == 0
    if not first:
        barrier()
    built = build()
    if first:
        barrier()
    return built


def agreed_resume(spec: RunSpec, log: RunLog) -> RunSpec:
    """On more than one machine: ``spec`` resuming from the run's newest valid checkpoint as this rank finds it at
    start (the one every rank of every node finds now), rather than the one its supervisor chose earlier."""
    if spec.nodes is None:
        return spec
    try:
        newest = weights.plan_resume_point(spec.paths.last).path
    except errors.UsageError:  # nothing saved yet
        return spec
    if spec.resume is not None and Path(spec.resume) == newest:
        return spec
    if not devices.local_rank():
        chosen = Path(spec.resume).name if spec.resume else "the start"
        log.info(f"resuming from {newest.name}, the run's newest checkpoint on every node (not {chosen})")
    return spec.with_changes(resume=str(newest))
