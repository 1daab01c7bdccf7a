"""Test seam: Ultralytics' multi-GPU (DDP) training on CPU "devices", with gloo.

Ultralytics runs DDP only on GPUs, and CI has none. With ``ROCM_YOLO_TEST_CPU_DDP=1`` and
``tests/seams`` on ``PYTHONPATH`` (so every process of a run imports its ``sitecustomize`` at start-up: the
supervisor, the trainer, ``torch.distributed.run`` and each rank), ``--device 0,1`` means two
CPU ranks. Once ``ultralytics.engine.trainer`` is imported, the seam changes what a GPU
machine would decide differently, and nothing else:

- **device selection**: ``select_device`` gives the CPU for a list of GPU ids, and a rank's
  final validation gets the CPU for its GPU (``cuda:current_device()``). The trainer
  then counts the ids as a GPU machine would (``world_size``). It keeps the requested
  ``workers``, which Ultralytics sets to 0 on a CPU.
- **``_setup_ddp``**: the process group is gloo on the CPU, with Ultralytics' own timeout,
  rank and world size.
- **``device_ids``**: ``DistributedDataParallel`` gets none for a module on the CPU.

Beside it, ``kfd/nodes`` is the topology of a machine with two GPUs (gfx1100, no presets),
for ``ROCM_YOLO_KFD_ROOT``: rocm-yolo's own check that the GPUs named exist reads the KFD topology,
as on an AMD machine (:mod:`rocm_yolo.gpu.count`), and so does every process of the run.

Everything else is real: ``torch.distributed.run``, the ranks, the all-reduce, the
``DistributedSampler``. One difference from a GPU machine remains. The process that
launches the ranks runs the ``on_pretrain_routine_start`` callbacks, because the world size
is counted after ``__init__``. rocm-yolo launches its ranks itself, so this touches only
plain Ultralytics in the benchmark.

**More than one machine** (``tests/e2e/test_e2e_multinode.py``, ``benchmarks/bench_ddp.py --nodes 2``): two
supervisors on this machine, each ``--device 0,1 --nnodes 2 --node-rank K --rdzv-endpoint 127.0.0.1:PORT``, are
two "nodes" of two CPU ranks each, meeting at torch's c10d rendezvous and sharing one run directory. Each
node's ranks come here as one machine's do: the CPU for their ids, gloo with torch's global ``RANK`` and
the trainer's world size. That world size is torch's ``WORLD_SIZE`` (four) by then: a rank of rocm-yolo sets
it after ``__init__`` on a GPU machine too (:mod:`rocm_yolo.trainer.rank`), and the plain side of the
benchmark does the same in its runner. Gloo's pairs connect over 127.0.0.1, where this machine's host
name resolves. Both "nodes" read the same fake topology of two GPUs, as two machines of two GPUs would.

The package never imports this module. It lives in ``tests/`` only.
"""

from __future__ import annotations

import os

ENV = "ROCM_YOLO_TEST_CPU_DDP"
DEVICES = "ultralytics.utils.torch_utils"  # select_device's home: patched before any module imports the name
TRAINER = "ultralytics.engine.trainer"
VALIDATOR = "ultralytics.engine.validator"


def _gpu_ids(device) -> list[str]:
    text = str(device if device is not None else "").strip().strip("[]()").replace(" ", "")
    ids = [x for x in text.split(",") if x]
    return ids if ids and all(x.isdigit() for x in ids) else []


def _patch_devices(module) -> None:
    import functools

    import torch

    original = module.select_device

    @functools.wraps(original)
    def select_device(device="", *args, **kwargs):
        return torch.device("cpu") if _gpu_ids(device) else original(device, *args, **kwargs)

    module.select_device = select_device


def _patch_validator(module) -> None:
    """A rank's final validation asks for the rank's GPU (``cuda:current_device()``): the CPU here."""
    import functools

    import torch

    original = module.AutoBackend

    @functools.wraps(original)
    def auto_backend(*args, device=None, **kwargs):
        if isinstance(device, torch.device) and device.type == "cuda" and not torch.cuda.is_available():
            device = torch.device("cpu")
        return original(*args, device=device, **kwargs)

    class NoGpu:
        @staticmethod
        def current_device() -> int:
            return 0

    backend = module.get_torch_device_backend

    def get_torch_device_backend(kind):
        return NoGpu if str(kind) == "cuda" and not torch.cuda.is_available() else backend(kind)

    module.AutoBackend = auto_backend
    module.get_torch_device_backend = get_torch_device_backend


def _patch_trainer(module) -> None:
    import functools
    from datetime import timedelta

    import torch
    from torch import distributed as dist
    from ultralytics.utils import LOCAL_RANK, RANK

    trainer_class = module.BaseTrainer
    original_init = trainer_class.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        ids = _gpu_ids(self.args.device)
        if ids:  # as on a GPU machine: one rank per id, and the workers asked for
            self.world_size = len(ids)
            self.ddp = self.world_size > 1 and LOCAL_RANK == -1
            requested = kwargs.get("overrides", args[1] if len(args) > 1 else None) or {}
            if "workers" in requested:
                self.args.workers = requested["workers"]

    def _setup_ddp(self):
        self.device, self.accelerator = torch.device("cpu"), None
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=10800), rank=RANK, world_size=self.world_size)

    trainer_class.__init__ = __init__
    trainer_class._setup_ddp = _setup_ddp

    ddp_class = torch.nn.parallel.DistributedDataParallel

    class CpuDistributedDataParallel(ddp_class):
        def __init__(self, module, device_ids=None, *args, **kwargs):
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            super().__init__(module, None if on_cpu else device_ids, *args, **kwargs)

    torch.nn.parallel.DistributedDataParallel = CpuDistributedDataParallel


PATCHES = {DEVICES: _patch_devices, TRAINER: _patch_trainer, VALIDATOR: _patch_validator}


def active() -> bool:
    return os.environ.get(ENV) == "1"
