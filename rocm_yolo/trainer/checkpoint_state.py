"""What a mid-epoch checkpoint holds, and the state its save and its resume share.

Ultralytics saves only at the end of an epoch, and its resume starts the next epoch; an epoch
of the users' runs took five hours. rocm-yolo writes ``weights/ep{E}-ba{B}.pt`` (B batches of
epoch E done) during the epoch (:mod:`.checkpoint_save`) and continues a run from one at the
next batch, as if it had never stopped (:mod:`.checkpoint_resume`).

**What a checkpoint holds.** The keys of Ultralytics' ``save_model`` (so ``YOLO(path)`` loads
it anywhere, and Ultralytics' own resume accepts it), with the EMA as a float32 module and
the optimizer state at full precision (``save_model`` stores both as fp16: lossy), and
``epoch`` = the last *completed* epoch, so Ultralytics' resume lands on the epoch in progress.
Under :data:`~rocm_yolo.run.checkpoints.MID_EPOCH_KEY`, plain types and tensors only: the
position (batch, batches per epoch, ``ni``, ``last_opt_step``), the raw model's float32
weights (resume otherwise rebuilds the model from the EMA), gradients accumulated since the
last optimizer step, the running loss, the early-stopping state, the RNG states (Python,
NumPy, torch, CUDA/HIP), the sampler's generator state at the start of the epoch's pass
(:mod:`.sample_order`) and, with the in-process loader, the dataset's mosaic buffer.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch

from rocm_yolo.patches import trainloop
from rocm_yolo.run.checkpoints import MID_EPOCH_KEY
from rocm_yolo.run.events import RunLog
from rocm_yolo.trainer import sample_order

FORMAT = 1  # the layout of MID_EPOCH_KEY


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
    from rocm_yolo.patches.threads import ATTRIBUTE

    return loader.num_workers == 0 and getattr(loader, ATTRIBUTE, None) is None


def position_mismatch(ckpt: dict | None, args: dict) -> str | None:
    """Why the mid-epoch position of ``ckpt`` means nothing with the train ``args`` given (batch, imgsz), or None.

    A value equal to what the checkpoint's run asked for (``requested``: e.g. ``batch=-1`` before
    AutoBatch chose 16, ``imgsz=600`` before Ultralytics rounded it to 608) or to what it used
    is no change."""
    state = (ckpt or {}).get(MID_EPOCH_KEY)
    if not state:
        return None
    saved = (ckpt or {}).get("train_args") or {}
    requested = state.get("requested") or {}
    changed = [
        f"{key} {saved.get(key)!r} -> {args[key]!r}"
        for key in ("batch", "imgsz")
        if key in args and args[key] not in (saved.get(key), requested.get(key, saved.get(key)))
    ]
    return ", ".join(changed) or None


def describe_position(state: dict, epochs) -> str:
    return f"epoch {state['epoch'] + 1}/{epochs}, batch {state['batch']:,}/{state['batches']:,}"


class TrainOrder:
    """The train loader's sample order in this process, shared by mid-epoch save and resume.

    It also is the feature's switch: :meth:`off` turns writing and continuing off for the rest
    of the process, and says why once.
    """

    def __init__(self, log: RunLog):
        self.log = log
        self.supported = True  # this Ultralytics can be continued inside an epoch (trainer.compat)
        self.loader = None
        self.sampler: sample_order.PassSampler | None = None
        self.tracker: sample_order.PassTracker | None = None

    def off(self, why: str | None) -> None:
        """Mid-epoch checkpoints are off in this process; ``why`` is said once (None: already said elsewhere)."""
        if self.supported:
            self.supported = False
            trainloop.disarm()
            if why:
                self.log.event("mid_epoch_off", f"mid-epoch checkpoints are off: {why}", reason=why)

    def follow(self, loader) -> bool:
        """Record ``loader``'s sample order (again when Ultralytics rebuilt it); False when the feature is off."""
        if self.supported and loader is not self.loader:
            self.loader = loader
            self.sampler = sample_order.install(loader)
            self.tracker = sample_order.PassTracker(self.sampler) if self.sampler is not None else None
            if self.sampler is None:
                self.off(
                    "the train loader is not Ultralytics' InfiniteDataLoader(BatchSampler(sampler)) before its "
                    "first batch, so its sample order cannot be replayed"
                )
        return self.supported
