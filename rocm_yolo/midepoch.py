"""Mid-epoch checkpoints: written during an epoch, and continued from inside their epoch.

Ultralytics saves only at the end of an epoch, and its resume starts the next epoch; an epoch
of the users' runs took five hours. :class:`MidEpochCheckpoints` is a set of ordinary
Ultralytics callbacks that, every ``--checkpoint-every`` (time or batches), writes
``weights/ep{E}-ba{B}.pt`` (B batches of epoch E done), and continues a run from one at the
next batch, as if it had never stopped.

**What a checkpoint holds.** The keys of Ultralytics' ``save_model`` (so ``YOLO(path)`` loads
it anywhere, and Ultralytics' own resume accepts it), with the EMA as a float32 module and
the optimizer state at full precision (``save_model`` stores both as fp16: lossy), and
``epoch`` = the last *completed* epoch, so Ultralytics' resume lands on the epoch in progress.
Under :data:`~rocm_yolo.checkpoints.MID_EPOCH_KEY`, plain types and tensors only: the
position (batch, batches per epoch, ``ni``, ``last_opt_step``), the raw model's float32
weights (resume otherwise rebuilds the model from the EMA), gradients accumulated since the
last optimizer step, the running loss, the early-stopping state, the RNG states (Python,
NumPy, torch, CUDA/HIP), the sampler's generator state at the start of the epoch's pass
(:mod:`rocm_yolo.sample_order`) and, with the in-process loader, the dataset's mosaic
buffer.

**Cost.** The callback only compares a clock or a counter per batch. When one is due, the
state is copied to host memory on the training thread (the only stall), and a background
thread serializes it and writes it with :func:`~rocm_yolo.fsutil.write_atomic`
(``durable=True``: temporary file, fsync, rename), verifies it as ``last.pt`` is verified,
and then deletes the older mid-epoch file: the newest good one is kept. If the previous
write is still running, the next checkpoint waits for it (a slow disk never stalls training).
After an epoch's ``last.pt`` is saved and verified, that epoch's mid-epoch files go.

**Resume.** ``resume_training`` (wrapped on the trainer instance) restores the optimizer,
scaler, EMA, raw weights and stopper (for the first epoch, where Ultralytics' resume cannot
start, it does it all); at the resumed epoch's start the callbacks set the loop's
``last_opt_step`` and accumulated gradients, make the loop's ``i`` start at the next batch
(:mod:`rocm_yolo.patches.trainloop`) and the sampler replay the epoch's order without the
batches done; the RNG states are restored when that pass starts, the running loss at the
first batch.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from rocm_yolo import checkpoints, faults, sample_order
from rocm_yolo.checkpoints import MID_EPOCH_KEY, CheckpointInterval
from rocm_yolo.fsutil import remove_temporaries, write_atomic
from rocm_yolo.log import RunLog
from rocm_yolo.patches import trainloop

FORMAT = 1


def _to_cpu(obj):
    """A deep copy of ``obj`` with every tensor copied to host memory (the training goes on mutating them)."""
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


class HostCopies:
    """Host-memory copies of the training state, reused from one checkpoint to the next.

    Allocating fresh host memory for every tensor (and faulting its pages in) costs several
    times the copy itself; after the first checkpoint a snapshot only copies into these
    buffers. They are rewritten only when the previous checkpoint's write has finished.
    """

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.ema = None  # a host copy of the EMA module (rebuilt each epoch: Ultralytics updates its attributes)
        self.ema_key = None

    def tensor(self, key: tuple, value: torch.Tensor) -> torch.Tensor:
        value = value.detach()
        buf = self.buffers.get(key)
        if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
            buf = self.buffers[key] = torch.empty(value.shape, dtype=value.dtype, device="cpu")
        return buf.copy_(value)

    def tree(self, key: tuple, obj):
        """``obj`` with every tensor copied into its buffer and everything else deep-copied."""
        if torch.is_tensor(obj):
            return self.tensor(key, obj)
        if isinstance(obj, dict):
            return {k: self.tree((*key, k), v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.tree((*key, i), v) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def module(self, live, epoch: int):
        """A host copy of module ``live`` (the EMA): a new deep copy when ``live`` or the epoch changed."""
        if self.ema is None or self.ema_key != (id(live), epoch):
            self.ema = copy.deepcopy(live).to("cpu", memory_format=torch.contiguous_format)
            if hasattr(self.ema, "criterion"):
                self.ema.criterion = None  # training-only state, as save_model strips it
            self.ema_key = (id(live), epoch)
        else:
            with torch.no_grad():
                for dst, src in zip(self.ema.state_dict().values(), live.state_dict().values()):
                    dst.copy_(src)
        return self.ema


def _unwrap(model):
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


def _loads_in_process(loader) -> bool:
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
    changed = [f"{key} {saved.get(key)!r} -> {args[key]!r}" for key in ("batch", "imgsz")
               if key in args and args[key] not in (saved.get(key), requested.get(key, saved.get(key)))]
    return ", ".join(changed) or None


def describe_position(state: dict, epochs) -> str:
    return f"epoch {state['epoch'] + 1}/{epochs}, batch {state['batch']:,}/{state['batches']:,}"


class MidEpochCheckpoints:
    """Ultralytics callbacks that write mid-epoch checkpoints and continue from one; they never break training."""

    def __init__(self, paths, log: RunLog, interval: CheckpointInterval, *, attempt: int = 1,
                 on_resumed: tuple[Callable[[int], None], ...] = (), saved_epoch: Callable[[], int | None] = lambda: None,
                 clock=time.monotonic, requested: dict | None = None):
        self.paths = paths
        self.requested = dict(requested or {})  # batch/imgsz as the run asked for them, before Ultralytics' changes
        self.log = log
        self.interval = interval
        self.attempt = attempt
        self.on_resumed = on_resumed
        self.saved_epoch = saved_epoch  # the last epoch whose last.pt was saved and verified (0-based)
        self.clock = clock
        self.supported = True  # this Ultralytics can be continued inside an epoch (rocm_yolo.compat)
        self.writing = interval.enabled  # and mid-epoch checkpoints are written
        self.loader = None
        self.sampler: sample_order.PassSampler | None = None
        self.tracker: sample_order.PassTracker | None = None
        self.resume: dict | None = None  # MID_EPOCH_KEY of the checkpoint this process continues
        self.resume_name = ""
        self.continuing = False  # between the resumed epoch's start and its first batch
        self.epoch_first_batch = False
        self.pass_number: int | None = None
        self.batch = 0  # batches of the current epoch done
        self.since_save = 0  # batches since the last checkpoint (mid-epoch or end of epoch)
        self.last_save = clock()
        self.writer: threading.Thread | None = None
        self.waiting_said = False
        self.written = 0
        self.failed = False
        self.host = HostCopies()
        self.record = os.environ.get(faults.RECORD_ENV)
        self.kill_fault = faults.find("save-kill")

    # setup ---------------------------------------------------------------------------------
    def _off(self, why: str) -> None:
        """Neither write nor continue mid-epoch checkpoints in this process, and say why once."""
        if self.supported:
            self.supported = self.writing = False
            self.resume = self.continuing = None
            trainloop.disarm()
            self.log.event("mid_epoch_off", f"mid-epoch checkpoints are off: {why}", reason=why)

    def on_pretrain_routine_start(self, trainer) -> None:
        from rocm_yolo import compat

        if compat.missing_for(compat.MID_EPOCH_FEATURE):  # compat.check() has said so at start-up
            self.supported = self.writing = False
            return
        trainloop.install()
        original = trainer.resume_training

        def resume_training(ckpt):
            state = (ckpt or {}).get(MID_EPOCH_KEY) if trainer.resume else None
            if not state:
                return original(ckpt)
            if state["epoch"] >= 1:
                original(ckpt)  # its "epoch" is the last completed one: Ultralytics starts the epoch in progress
            else:
                self._load_training_state(trainer, ckpt)  # the first epoch: Ultralytics' resume cannot start it
            self._restore_weights(trainer, ckpt, state)

        trainer.resume_training = resume_training

    @staticmethod
    def _load_training_state(trainer, ckpt: dict) -> None:
        """What Ultralytics' resume loads (optimizer, scaler, EMA, best fitness, stopper), for the first epoch."""
        optimizer = ckpt["optimizer"]
        for saved, group in zip(optimizer["param_groups"], trainer.optimizer.param_groups):
            if "fused" in group:
                saved["fused"] = group["fused"]
        trainer.optimizer.load_state_dict(optimizer)
        if ckpt.get("scaler"):
            trainer.scaler.load_state_dict(ckpt["scaler"])
        trainer.ema.ema.load_state_dict(ckpt["ema"].float().state_dict())
        trainer.ema.updates = ckpt["updates"]
        trainer.best_fitness = ckpt.get("best_fitness")

    def _restore_weights(self, trainer, ckpt: dict, state: dict) -> None:
        _unwrap(trainer.model).load_state_dict(state["model"])  # resume rebuilt the model from the EMA
        # its state, not its settings: Ultralytics lets a resume change patience
        trainer.stopper.__dict__.update({k: v for k, v in state["stopper"].items() if k != "patience"})
        metrics = dict(ckpt.get("train_metrics") or {})
        trainer.fitness = metrics.pop("fitness", None)
        if metrics and trainer.metrics is not None:
            trainer.metrics.update(metrics)
        self.resume = {k: v for k, v in state.items() if k != "model"}
        self.resume_name = Path(str(trainer.args.resume)).name

    def on_pretrain_routine_end(self, trainer) -> None:
        if not self.supported:
            return
        self._attach(trainer.train_loader)
        state = self.resume
        if state is None or not self.supported:
            return
        loader = trainer.train_loader
        found = (len(loader), len(loader.dataset), sample_order.batch_size(loader))
        saved = (state["batches"], state["samples"], state["batch_size"])
        if found != saved:
            self.log.event("resume_position", f"the data set or batch changed ({saved[1]} images in {saved[0]} batches "
                           f"of {saved[2]} -> {found[1]} in {found[0]} of {found[2]}): training epoch "
                           f"{state['epoch'] + 1} from its first batch", found=found, saved=saved)
            self.resume = None
            return
        self.sampler.resume_next_pass(state["sampler"]["state"], state["sampler"]["skip"],
                                      on_start=lambda: set_rng_states(state["rng"]))
        if state.get("buffer") and _loads_in_process(loader):
            self._refill_buffer(loader.dataset, state["buffer"])

    def _attach(self, loader) -> None:
        self.loader = loader
        self.sampler = sample_order.install(loader)
        self.tracker = sample_order.PassTracker(self.sampler) if self.sampler is not None else None
        if self.sampler is None:
            self._off("the train loader is not Ultralytics' InfiniteDataLoader(BatchSampler(sampler)) before its "
                      "first batch, so its sample order cannot be replayed")

    @staticmethod
    def _refill_buffer(dataset, buffer: list) -> None:
        """Load the mosaic buffer's images in order: the in-process dataset's buffer and cache as they were."""
        for index in buffer:
            if 0 <= index < len(dataset) and dataset.ims[index] is None:
                dataset.load_image(index)

    # epochs and batches --------------------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        self.last_save = self.clock()

    def on_train_epoch_start(self, trainer) -> None:
        self.batch = 0
        if not self.supported:
            return
        if trainer.train_loader is not self.loader:  # rebuilt (Ultralytics halves the batch after an OOM)
            self.resume = None
            self._attach(trainer.train_loader)
            if not self.supported:
                return
        self.tracker.epoch_started()
        self.epoch_first_batch = True
        state, self.resume = self.resume, None
        if state is None:
            return
        if trainer.epoch != state["epoch"]:
            self.log.event("resume_position", f"Ultralytics started epoch {trainer.epoch + 1}, not the checkpoint's "
                           f"{state['epoch'] + 1}: training it from its first batch")
            return
        try:
            trainloop.set_local(trainloop.loop_frame(trainer), "last_opt_step", state["last_opt_step"])
        except Exception as e:  # noqa: BLE001 - a changed loop: retrain the epoch's first batches instead
            self._off(f"cannot continue the training loop inside the epoch ({type(e).__name__}: {e}); "
                      f"training epoch {state['epoch'] + 1} from its first batch")
            return
        params = dict(_unwrap(trainer.model).named_parameters())
        for name, grad in state["grads"].items():
            params[name].grad = grad.to(params[name].device)
        b, nb = state["batch"], state["batches"]
        trainloop.arm(trainer.train_loader, b, nb - b)
        self.batch = b
        self.continuing = state
        for listener in self.on_resumed:
            listener(b)
        self.log.event("resumed", f"resumed at {describe_position(state, trainer.epochs)} from {self.resume_name}; "
                       f"continuing with batch {b + 1:,}", epoch=state["epoch"] + 1, batch=b, batches=nb,
                       checkpoint=self.resume_name)

    def on_train_batch_start(self, trainer) -> None:
        if self.epoch_first_batch:
            self.epoch_first_batch = False
            self.pass_number = self.tracker.first_batch(getattr(trainer.train_loader, "iterator", None))
        if self.continuing:
            state, self.continuing = self.continuing, False
            trainloop.disarm()
            i = trainloop.read_locals(trainloop.loop_frame(trainer), ("i",)).get("i")
            if i != state["batch"]:
                self._off(f"the training loop started at batch {i}, not {state['batch']}")
                return
            device = next(_unwrap(trainer.model).parameters()).device
            trainer.tloss = {k: v.to(device) for k, v in state["tloss"].items()} if state["tloss"] else None

    def on_train_batch_end(self, trainer) -> None:
        self.batch += 1
        self.since_save += 1
        if self.record:
            self._record(trainer)
        if not self.writing or self.batch >= len(trainer.train_loader) or trainer.stop:
            return  # the end of the epoch saves last.pt anyway
        if self.interval.batches:
            due = self.since_save >= self.interval.batches
        else:
            due = self.clock() - self.last_save >= self.interval.seconds
        if not due:
            return
        if self.writer is not None and self.writer.is_alive():
            if not self.waiting_said:
                self.waiting_said = True
                self.log.info("a mid-epoch checkpoint is due but the previous one is still being written: "
                              "the next one waits for it (a slow disk?)")
            return
        try:
            self._save(trainer)
        except Exception as e:  # never break training for a checkpoint; say it once
            if not self.failed:
                self.failed = True
                self.log.event("mid_checkpoint_error", f"could not take a mid-epoch checkpoint: "
                               f"{type(e).__name__}: {e}", error=str(e))

    def on_train_epoch_end(self, trainer) -> None:
        self.join()  # a mid-epoch file is always older than the epoch's last.pt

    def on_model_save(self, trainer) -> None:
        """After an end-of-epoch save: once its last.pt is verified, the epoch's mid-epoch files go."""
        self.join()
        self.since_save = 0
        self.last_save = self.clock()
        saved = self.saved_epoch()
        if saved is not None and saved == trainer.epoch:
            checkpoints.remove_mid_checkpoints(self.paths, through_epoch=trainer.epoch + 1)

    def on_train_end(self, trainer) -> None:
        self.join()
        trainloop.uninstall()

    def join(self) -> None:
        if self.writer is not None:
            self.writer.join()
            self.writer = None

    # saving --------------------------------------------------------------------------------
    def _save(self, trainer) -> None:
        started = time.perf_counter()
        loop = trainloop.read_locals(trainloop.loop_frame(trainer))
        b = loop["i"] + 1
        if b != self.batch:
            raise RuntimeError(f"the loop is at batch {b}, the callbacks counted {self.batch}")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # thousands of small copies: intra-op threads only add synchronization (10x+ when busy)
        try:
            ckpt = self._snapshot(trainer, loop, b)
        finally:
            torch.set_num_threads(threads)
        stall = time.perf_counter() - started
        path = self.paths.mid_checkpoint(trainer.epoch + 1, b)
        position = describe_position(ckpt[MID_EPOCH_KEY], trainer.epochs)
        self.since_save = 0
        self.last_save = self.clock()
        self.waiting_said = False
        self.writer = threading.Thread(target=self._write, args=(ckpt, path, position, stall, (trainer.epoch + 1, b)),
                                       name="rocm-yolo-checkpoint")
        self.writer.start()  # not a daemon: a stop (SIGTERM) lets the write in progress finish

    def _snapshot(self, trainer, loop: dict, b: int) -> dict:
        """Everything the checkpoint holds, copied to host memory now (the training thread's only stall)."""
        import ultralytics

        model = _unwrap(trainer.model)
        host = self.host
        ema = host.module(trainer.ema.ema, trainer.epoch)
        pending = loop["last_opt_step"] != loop["ni"]
        loader = trainer.train_loader
        order = self.sampler.state_of(self.pass_number) if self.pass_number is not None else None
        if order is None and self.sampler.generator is not None:
            raise RuntimeError("the sample order of this epoch's pass is unknown")
        dataset = loader.dataset
        bs = sample_order.batch_size(loader)
        state = {
            "format": FORMAT,
            "requested": self.requested,
            "epoch": trainer.epoch,
            "batch": b,
            "batches": len(loader),
            "samples": len(dataset),
            "batch_size": bs,
            "ni": loop["ni"],
            "last_opt_step": loop["last_opt_step"],
            "model": host.tree(("model",), model.state_dict()),
            "grads": {n: host.tensor(("grad", n), p.grad) for n, p in model.named_parameters()
                      if pending and p.grad is not None},
            "tloss": _to_cpu(dict(trainer.tloss)) if trainer.tloss else None,
            "stopper": _to_cpu(dict(trainer.stopper.__dict__)),
            "rng": rng_states(),
            "sampler": {"state": order, "skip": b * bs},
            "buffer": list(getattr(dataset, "buffer", []) or []) if _loads_in_process(loader) else None,
        }
        return {
            "epoch": trainer.epoch - 1,  # the last completed epoch: Ultralytics' resume starts this one
            "best_fitness": trainer.best_fitness,
            "stopper": {"best_fitness": trainer.stopper.best_fitness, "best_epoch": trainer.stopper.best_epoch},
            "model": None,
            "ema": ema,
            "updates": trainer.ema.updates,
            "optimizer": host.tree(("optimizer",), trainer.optimizer.state_dict()),
            "scaler": trainer.scaler.state_dict(),
            "train_args": dict(vars(trainer.args)),
            "train_metrics": {**(trainer.metrics or {}), "fitness": trainer.fitness},
            "date": datetime.now().astimezone().isoformat(),
            "version": ultralytics.__version__,
            MID_EPOCH_KEY: state,
        }

    def _write(self, ckpt: dict, path: Path, position: str, stall: float, where: tuple[int, int]) -> None:
        started = time.perf_counter()
        try:
            write_atomic(path, self._serializer(ckpt, where), durable=True)
            reason = checkpoints.verify(path)
            if reason is not None:
                path.unlink(missing_ok=True)
                raise OSError(f"{path.name} failed verification right after the write ({reason})")
            removed = checkpoints.remove_mid_checkpoints(self.paths, keep=path)
            seconds = time.perf_counter() - started
            size = path.stat().st_size
            self.written += 1
            message = None
            if self.written == 1:
                message = (f"mid-epoch checkpoints {self.interval.describe()}: {path.name} at {position} "
                           f"({size / 2**20:.1f} MB; {stall * 1000:.0f} ms of training time, "
                           f"{seconds:.2f} s in the background)")
            self.log.event("mid_checkpoint", message, path=str(path), epoch=where[0], batch=where[1], bytes=size,
                           stall_seconds=round(stall, 4), write_seconds=round(seconds, 4),
                           removed=[p.name for p in removed])
        except Exception as e:  # a failed checkpoint must not stop training; the older one stays
            self.log.event("mid_checkpoint_error", f"could not write the mid-epoch checkpoint {path.name}: "
                           f"{type(e).__name__}: {e}; the previous checkpoint is kept", error=str(e))

    def _serializer(self, ckpt: dict, where: tuple[int, int]) -> Callable:
        fault = self.kill_fault
        if fault is not None and (fault.epoch is None or where >= (fault.epoch, fault.batch)) \
                and faults.claim(fault, self.paths):
            def kill_halfway(f) -> None:  # tests: a SIGKILL in the middle of the write
                import io

                buffer = io.BytesIO()
                torch.save(ckpt, buffer)
                data = buffer.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)

            return kill_halfway
        return lambda f: torch.save(ckpt, f)

    # tests ---------------------------------------------------------------------------------
    def _record(self, trainer) -> None:
        import json

        loop = trainloop.read_locals(trainloop.loop_frame(trainer), ("i", "batch"))
        batch = loop.get("batch") or {}
        line = {"attempt": self.attempt, "epoch": trainer.epoch + 1, "batch": loop.get("i"),
                "files": [Path(f).name for f in batch.get("im_file", ())]}
        with open(self.record, "a") as f:
            f.write(json.dumps(line) + "\n")


def clean_temporaries(paths) -> None:
    """Temporary files a killed checkpoint write left in ``weights/`` (never a checkpoint itself)."""
    remove_temporaries(paths.weights)
