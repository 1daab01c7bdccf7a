"""The training state a mid-epoch checkpoint holds, copied to host memory and back: tensors, RNG states.

Ultralytics saves only at the end of an epoch, and its resume starts the next epoch; an epoch
of the users' runs took five hours. rocm-yolo writes ``weights/ep{E}-ba{B}.pt`` (B batches of
epoch E done) during the epoch (:mod:`.save`) and continues a run from one at the next batch,
as if it had never stopped (:mod:`.restore`).

**What a checkpoint holds.** The keys of Ultralytics' ``save_model`` (so ``YOLO(path)`` loads
it anywhere, and Ultralytics' own resume accepts it), with the EMA as a float32 module and
the optimizer state at full precision (``save_model`` stores both as fp16: lossy), and
``epoch`` = the last *completed* epoch, so Ultralytics' resume lands on the epoch in progress.
Under :data:`~rocm_yolo.run.midepoch_state.MID_EPOCH_KEY`, the record
:class:`~rocm_yolo.run.midepoch_state.MidEpochState`, plain types and tensors only: the position
(batch, batches per epoch, ``ni``, ``last_opt_step``), the raw model's float32 weights
(resume otherwise rebuilds the model from the EMA), gradients accumulated since the last
optimizer step, the running loss, the early-stopping state, the RNG states (Python, NumPy,
torch, CUDA/HIP), the sampler's state at the start of the epoch's pass (:mod:`.sample_order`)
and, with the in-process loader, the dataset's mosaic buffer.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch


def to_cpu(obj):
    """A deep copy of ``obj`` with every tensor copied to host memory (the training goes on mutating them)."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def unwrap(model):
    from ultralytics.utils.torch_utils import unwrap_model

    return unwrap_model(model)


def rng_states() -> dict:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def loads_in_process(loader) -> bool:
    """The loader's dataset object itself loads the samples (``single``): not workers, nor the
    ``threads`` profile's threads, which load with copies of it (their mosaic buffers are their own)."""
    from rocm_yolo.patches.loaders.threads import ATTRIBUTE

    return loader.num_workers == 0 and getattr(loader, ATTRIBUTE, None) is None
