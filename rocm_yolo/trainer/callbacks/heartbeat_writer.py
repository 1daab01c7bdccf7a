"""The heartbeat's writer: Ultralytics callbacks in the training child (the record: :mod:`rocm_yolo.run.heartbeat`).

It beats at most about once a second, plus at every phase change (setup, train, val, save,
done), down the supervisor's pipe and into ``heartbeat.json``. The per-batch cost is two
``time.monotonic()`` calls and a compare. A heartbeat file that cannot be written (a full or
read-only disk) is said once, and is not taken for a hang: the supervisor listens to the pipe.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from rocm_yolo import environment
from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.heartbeat import DATA, FIRST_BATCH, FIRST_STEP, MIN_INTERVAL, WORKERS, position_line


class HeartbeatWriter:
    """Ultralytics callbacks that keep ``heartbeat.json`` current; they never raise."""

    def __init__(
        self,
        path: Path,
        attempt: int = 1,
        clock=time.monotonic,
        pipe_fd: int | None = None,
        on_error: Callable[[str], None] | None = None,
        rank: int = 0,
        local_rank: int | None = None,
        spawned_workers: bool = False,
        world: int = 1,
    ):
        self.path = Path(path)
        self.spawned_workers = spawned_workers  # the first batch waits for workers that import torch: start-up
        local_rank = rank if local_rank is None else local_rank
        self.positions = local_rank == 0  # position lines between records: its node's local rank 0's (it speaks)
        self.clock = clock
        self.pipe_fd = pipe_fd if pipe_fd is not None else _fd_from_env()
        self.on_error = on_error
        self.file_error: str | None = None  # set once the file could not be written
        self.seq = 0
        self.state = {
            "pid": os.getpid(),
            "attempt": attempt,
            "phase": "setup",
            "epoch": 0,
            "epochs": 0,
            "batch": 0,
            "batches": 0,
            "batches_total": 0,
            "started": time.time(),
            "rank": rank,
            "local_rank": local_rank,
            "startup": "",
            "world": world,
        }
        self.step_max = 0.0
        self.step_last = 0.0
        self.it_s = 0.0
        self.last_write = float("-inf")
        self.last_step = clock()
        self.pass_start = True  # the next step is the first of a pass (epoch, validation, resumed epoch)
        self.write("setup")

    def write(self, phase: str | None = None, force: bool = False) -> bool:
        """A new event; the whole record is written when forced or a second has passed. Whether it was."""
        try:
            now = self.clock()
            self.seq += 1
            if phase is not None and phase != self.state["phase"]:
                self.state["phase"] = phase
                force = True
            if not force and now - self.last_write < MIN_INTERVAL:
                return False
            record = {
                **self.state,
                "seq": self.seq,
                "step_max": round(self.step_max, 4),
                "step_last": round(self.step_last, 4),
                "it_s": round(self.it_s, 3),
                "time": time.time(),
            }
            text = json.dumps(record)
            self._send(text)
            self._write_file(text)
            self.last_write = now
            self.step_max = 0.0
            return True
        except Exception:  # a heartbeat must never break training
            return False

    def _send(self, text: str) -> None:
        if self.pipe_fd is None:
            return
        try:
            os.write(self.pipe_fd, text.encode() + b"\n")  # < PIPE_BUF: one atomic write
        except BlockingIOError:
            pass  # a full pipe (some 200 records, minutes of beats unread): drop this one rather than block training
        except OSError:
            self.pipe_fd = None  # the supervisor is gone

    def _write_file(self, text: str) -> None:
        try:
            write_atomic(self.path, text)
        except OSError as e:
            if self.file_error is None:  # say it once; the supervisor still hears the pipe
                self.file_error = f"{e.strerror or e}"
                if self.on_error is not None:
                    self.on_error(
                        f"cannot write the heartbeat file {self.path} ({self.file_error}); the watchdog "
                        "still hears the trainer, but 'rocm-yolo status' shows the last progress written"
                    )

    def _step(self, train: bool = True) -> None:
        now = self.clock()
        dt = now - self.last_step
        self.last_step = now
        self.step_last = dt
        if self.pass_start:
            self.pass_start = False
            return  # the first step of a pass includes worker start-up: not a step time
        self.step_max = max(self.step_max, dt)
        if train and dt > 0:
            self.it_s = 1.0 / dt if self.it_s == 0 else 0.9 * self.it_s + 0.1 / dt

    def _starting(self, step: str) -> None:
        """Before the attempt's first trained batch: it moved on to ``step`` (the watchdog's allowance follows)."""
        if self.state["batches_total"] == 0 and self.state["startup"] != step:
            self.state["startup"] = step
            self.write(force=True)

    # Ultralytics callbacks -------------------------------------------------------------
    def on_pretrain_routine_start(self, trainer) -> None:
        self._starting(DATA)

    def on_train_epoch_start(self, trainer) -> None:
        self.state.update(epoch=trainer.epoch + 1, epochs=trainer.epochs, batch=0, batches=len(trainer.train_loader))
        if self.state["batches_total"] == 0:  # the loader is iterated next: waiting for it is no start-up, but
            self.state["startup"] = WORKERS if self.spawned_workers else FIRST_BATCH  # spawned workers' imports are
        self.last_step = self.clock()
        self.pass_start = True
        self.write("train", force=True)

    def on_train_batch_start(self, trainer) -> None:
        self._starting(FIRST_STEP)  # the first batch came: its step may tune GPU kernels for minutes

    def resumed_at(self, batch: int) -> None:
        """The epoch continues after ``batch`` batches trained before a restart (a mid-epoch checkpoint)."""
        self.state["batch"] = batch
        self.write("train", force=True)

    def on_train_batch_end(self, trainer) -> None:
        first = self.pass_start
        self._step()
        self.state["batch"] += 1
        self.state["batches_total"] += 1
        self.state["startup"] = ""
        if not self.write("train", force=first) and self.positions:  # an epoch's first batch is always written
            # between records: the finished batch still reaches the supervisor, in a few bytes down the pipe
            # (where a hang stops and how much a restart trains again are then exact)
            s = self.state
            self._send(position_line(self.seq, s["epoch"], s["batch"], s["batches_total"], time.time()))

    def on_val_start(self, validator) -> None:
        try:
            batches = len(validator.dataloader)
        except Exception:
            batches = 0
        self.state.update(batch=0, batches=batches)
        self.last_step = self.clock()
        self.pass_start = True
        self.write("val", force=True)

    def on_val_batch_end(self, validator) -> None:
        first = self.pass_start
        self._step(train=False)
        self.state["batch"] += 1
        self.write("val", force=first)

    def on_model_save(self, trainer) -> None:
        self.write("save", force=True)

    def on_train_end(self, trainer) -> None:
        self.write("done", force=True)


def _fd_from_env() -> int | None:
    value = os.environ.get(environment.HEARTBEAT_FD, "")
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    os.set_blocking(fd, False)
    return fd
