"""Writing mid-epoch checkpoints: Ultralytics callbacks, every ``--checkpoint-every`` (time or batches).

**Cost.** The callback only compares a clock or a counter per batch. When one is due, the
state is copied to host memory on the training thread (the only stall), and a background
thread serializes it and writes it with :func:`~rocm_yolo.run.atomic.write_atomic`
(``durable=True``: temporary file, fsync, rename), verifies it as ``last.pt`` is verified,
and then deletes the older mid-epoch file: the newest good one is kept. If the previous
write is still running when the next one is due, that one is put off to the first batch
after the write ends (a slow disk never stalls training). After an epoch's ``last.pt`` is
saved and verified, that epoch's mid-epoch files go. What a checkpoint holds:
:mod:`.capture` and :class:`~rocm_yolo.run.midepoch_state.MidEpochState`.

**A stop waits for the write in progress.** The writer is no daemon thread, so the trainer's exit
(SIGTERM: ``SystemExit`` on the main thread) waits for it. The one place where the main thread
itself waits for it, :meth:`MidEpochSave.join`, is an :func:`~rocm_yolo.process.lifecycle.uninterrupted`
block: the stop comes when the write has ended. A ``Thread.join`` of CPython before 3.13 that a signal
handler's exception interrupts takes the thread for ended (python/cpython#90882), and the exit then
did not wait: the write was cut short and left its temporary file.
"""

from __future__ import annotations

import copy
import threading
import time
from datetime import datetime
from pathlib import Path

import torch

from rocm_yolo.patches.saves import loop_position
from rocm_yolo.process.lifecycle import uninterrupted
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import hooks, weights
from rocm_yolo.run.atomic import remove_temporaries, write_atomic
from rocm_yolo.run.devices import Layout
from rocm_yolo.run.midepoch_state import MID_EPOCH_KEY, CheckpointInterval, MidEpochState
from rocm_yolo.trainer.midepoch import sample_order
from rocm_yolo.trainer.midepoch.capture import loads_in_process, rng_states, to_cpu, unwrap
from rocm_yolo.trainer.midepoch.sample_order import TrainOrder


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


class MidEpochSave:
    """Ultralytics callbacks that write mid-epoch checkpoints; they never break training."""

    def __init__(
        self,
        paths,
        log: RunLog,
        interval: CheckpointInterval,
        order: TrainOrder,
        *,
        clock=time.monotonic,
        requested: dict | None = None,
    ):
        self.paths = paths
        self.log = log
        self.interval = interval
        self.order = order
        self.clock = clock
        self.requested = dict(requested or {})  # batch/imgsz as the run asked for them, before Ultralytics' changes
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

    @property
    def writing(self) -> bool:
        return self.interval.enabled and self.order.supported

    # epochs and batches --------------------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        self.last_save = self.clock()

    def on_train_epoch_start(self, trainer) -> None:
        self.batch = 0
        if self.order.follow(
            trainer.train_loader
        ):  # again if Ultralytics rebuilt it (it halves the batch after an OOM)
            self.order.tracker.epoch_started()
            self.epoch_first_batch = True

    def resumed_at(self, batch: int) -> None:
        """The epoch continues after ``batch`` batches trained before a restart (a mid-epoch checkpoint)."""
        self.batch = batch

    def on_train_batch_start(self, trainer) -> None:
        if self.epoch_first_batch:
            self.epoch_first_batch = False
            self.pass_number = self.order.tracker.first_batch(getattr(trainer.train_loader, "iterator", None))

    def on_train_batch_end(self, trainer) -> None:
        self.batch += 1
        self.since_save += 1
        if not self.writing or self.batch >= len(trainer.train_loader) or trainer.stop or not self._due():
            return  # the end of the epoch saves last.pt anyway
        if self.writer is not None and self.writer.is_alive():
            if not self.waiting_said:
                self.waiting_said = True
                self.log.info(
                    "a mid-epoch checkpoint is due but the previous one is still being written: "
                    "the next one waits for it (a slow disk?)"
                )
            return
        try:
            self._save(trainer)
        except Exception as e:  # never break training for a checkpoint; say it once
            if not self.failed:
                self.failed = True
                self.log.event(
                    "mid_checkpoint_error",
                    f"could not take a mid-epoch checkpoint: {type(e).__name__}: {e}",
                    error=str(e),
                )

    def _due(self) -> bool:
        if self.interval.batches:
            return self.since_save >= self.interval.batches
        return self.clock() - self.last_save >= self.interval.seconds

    def on_train_epoch_end(self, trainer) -> None:
        self.join()  # a mid-epoch file is always older than the epoch's last.pt

    def on_model_save(self, trainer) -> None:
        """After an end-of-epoch save: the interval starts again (the epoch's files go once its copy is verified)."""
        self.join()
        self.since_save = 0
        self.last_save = self.clock()

    def verified(self, epoch: int) -> None:
        """The end-of-epoch ``last.pt`` of ``epoch`` (0-based) was saved and verified: that epoch's mid-epoch files
        go (:class:`rocm_yolo.trainer.callbacks.good_copy.GoodCopy` says so, from its thread)."""
        weights.remove_mid_checkpoints(self.paths, through_epoch=epoch + 1)

    def on_train_end(self, trainer) -> None:
        self.join()

    def join(self) -> None:
        """Wait for the write in progress; a stop that comes meanwhile comes after it."""
        if self.writer is not None:
            with uninterrupted():  # never a join interrupted by the stop's SystemExit (python/cpython#90882)
                self.writer.join()
            self.writer = None

    # saving --------------------------------------------------------------------------------
    def _save(self, trainer) -> None:
        started = time.perf_counter()
        loop = loop_position.read_locals(loop_position.loop_frame(trainer))
        b = loop["i"] + 1
        if b != self.batch:
            raise RuntimeError(f"the loop is at batch {b}, the callbacks counted {self.batch}")
        threads = torch.get_num_threads()
        torch.set_num_threads(
            1
        )  # thousands of small copies: intra-op threads only add synchronization (10x+ when busy)
        try:
            state = self._position(trainer, loop, b)
            ckpt = self._snapshot(trainer, state)
        finally:
            torch.set_num_threads(threads)
        stall = time.perf_counter() - started
        path = self.paths.mid_checkpoint(trainer.epoch + 1, b)
        position = state.describe(trainer.epochs)
        self.since_save = 0
        self.last_save = self.clock()
        self.waiting_said = False
        self.writer = threading.Thread(
            target=self._write, args=(ckpt, path, position, stall, (trainer.epoch + 1, b)), name="rocm-yolo-checkpoint"
        )
        self.writer.start()  # not a daemon: a stop (SIGTERM) lets the write in progress finish

    def _position(self, trainer, loop: dict, b: int) -> MidEpochState:
        """Where the epoch is and everything that continues it, copied to host memory."""
        model, host, loader = unwrap(trainer.model), self.host, trainer.train_loader
        sampler = self.order.sampler
        order = sampler.state_of(self.pass_number) if self.pass_number is not None else None
        if order is None and (sampler.generator is not None or sampler.distributed):
            raise RuntimeError("the sample order of this epoch's pass is unknown")
        pending = loop["last_opt_step"] != loop["ni"]
        dataset, bs = loader.dataset, sample_order.batch_size(loader)
        return MidEpochState(
            requested=self.requested,
            epoch=trainer.epoch,
            batch=b,
            batches=len(loader),
            samples=len(dataset),
            batch_size=bs,
            ni=loop["ni"],
            last_opt_step=loop["last_opt_step"],
            model=host.tree(("model",), model.state_dict()),
            grads={
                n: host.tensor(("grad", n), p.grad)
                for n, p in model.named_parameters()
                if pending and p.grad is not None
            },
            tloss=to_cpu(dict(trainer.tloss)) if trainer.tloss else None,
            stopper=to_cpu(dict(trainer.stopper.__dict__)),
            rng=rng_states(),
            sampler_state=order,
            skip=b * bs,
            layout=self._layout(trainer, bs).to_dict(),
            buffer=list(getattr(dataset, "buffer", []) or []) if loads_in_process(loader) else None,
        )

    def _layout(self, trainer, rank_batch: int) -> Layout:
        """The layout the position counts in: the run's, else this attempt's own ranks."""
        return self.order.relaid.layout if self.order.relaid else Layout(max(trainer.world_size, 1), rank_batch)

    def _snapshot(self, trainer, state: MidEpochState) -> dict:
        """Everything the checkpoint holds, copied to host memory now (the training thread's only stall)."""
        import ultralytics

        return {
            "epoch": trainer.epoch - 1,  # the last completed epoch: Ultralytics' resume starts this one
            "best_fitness": trainer.best_fitness,
            "stopper": {"best_fitness": trainer.stopper.best_fitness, "best_epoch": trainer.stopper.best_epoch},
            "model": None,
            "ema": self.host.module(trainer.ema.ema, trainer.epoch),
            "updates": trainer.ema.updates,
            "optimizer": self.host.tree(("optimizer",), trainer.optimizer.state_dict()),
            "scaler": trainer.scaler.state_dict(),
            "train_args": dict(vars(trainer.args)),
            "train_metrics": {**(trainer.metrics or {}), "fitness": trainer.fitness},
            "date": datetime.now().astimezone().isoformat(),
            "version": ultralytics.__version__,
            MID_EPOCH_KEY: state.to_dict(),
        }

    def _write(self, ckpt: dict, path: Path, position: str, stall: float, where: tuple[int, int]) -> None:
        started = time.perf_counter()
        try:
            writer = hooks.checkpoint_writer(self.paths, where)  # tests: a SIGKILL halfway through (save-kill)
            write_atomic(path, (lambda f: writer(ckpt, f)) if writer else (lambda f: torch.save(ckpt, f)), durable=True)
            reason = weights.verify(path)
            if reason is not None:
                path.unlink(missing_ok=True)
                raise OSError(f"{path.name} failed verification right after the write ({reason})")
            removed = weights.remove_mid_checkpoints(self.paths, keep=path)
            seconds = time.perf_counter() - started
            size = path.stat().st_size
            self.written += 1
            message = None
            if self.written == 1:
                message = (
                    f"mid-epoch checkpoints {self.interval.describe()}: {path.name} at {position} "
                    f"({size / 2**20:.1f} MB; {stall * 1000:.0f} ms of training time, "
                    f"{seconds:.2f} s in the background)"
                )
            self.log.event(
                "mid_checkpoint",
                message,
                path=str(path),
                epoch=where[0],
                batch=where[1],
                bytes=size,
                stall_seconds=round(stall, 4),
                write_seconds=round(seconds, 4),
                removed=[p.name for p in removed],
            )
        except Exception as e:  # a failed checkpoint must not stop training; the older one stays
            self.log.event(
                "mid_checkpoint_error",
                f"could not write the mid-epoch checkpoint {path.name}: "
                f"{type(e).__name__}: {e}; the previous checkpoint is kept",
                error=str(e),
            )


def clean_temporaries(paths) -> None:
    """Temporary files a killed checkpoint write left in ``weights/`` (never a checkpoint itself)."""
    remove_temporaries(paths.weights)
