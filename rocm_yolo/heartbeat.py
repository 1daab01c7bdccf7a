"""The heartbeat: how the training child tells the supervisor (and ``rocm-yolo status``) it lives.

The writer is a set of ordinary Ultralytics callbacks. It writes ``heartbeat.json`` in the
run's rocm-yolo directory atomically (temporary file, then rename), at most about once a
second, plus at every phase change (setup, train, val, save, done). Each write carries a
sequence number that grows with every event, so "no progress" is "no new sequence number",
whatever the clocks say. The per-batch cost is two ``time.monotonic()`` calls and a compare.

The reader returns ``None`` for a missing or half-written file instead of raising.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

FILENAME = "heartbeat.json"
MIN_INTERVAL = 1.0  # seconds between writes inside one phase


@dataclass(frozen=True)
class Heartbeat:
    seq: int
    pid: int
    attempt: int
    phase: str  # setup | train | val | save | done
    epoch: int  # 1-based; 0 during setup
    epochs: int
    batch: int  # batches done in this epoch (train) or validation batches done (val)
    batches: int  # batches per epoch (train) or in the validation pass (val)
    step_max: float  # slowest step (seconds) since the previous write
    step_last: float
    batches_total: int  # train batches done by this attempt
    it_s: float  # recent training speed, iterations per second
    time: float  # wall clock of the write
    started: float  # wall clock when this attempt started


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(path: str | os.PathLike) -> Heartbeat | None:
    try:
        data = json.loads(Path(path).read_text())
        return Heartbeat(**data)
    except (OSError, ValueError, TypeError):
        return None


class HeartbeatWriter:
    """Ultralytics callbacks that keep ``heartbeat.json`` current; they never raise."""

    def __init__(self, path: Path, attempt: int = 1, clock=time.monotonic):
        self.path = Path(path)
        self.clock = clock
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
        }
        self.step_max = 0.0
        self.step_last = 0.0
        self.it_s = 0.0
        self.last_write = float("-inf")
        self.last_step = clock()
        self.write("setup")

    def write(self, phase: str | None = None, force: bool = False) -> None:
        try:
            now = self.clock()
            self.seq += 1
            if phase is not None and phase != self.state["phase"]:
                self.state["phase"] = phase
                force = True
            if not force and now - self.last_write < MIN_INTERVAL:
                return
            record = {
                **self.state,
                "seq": self.seq,
                "step_max": round(self.step_max, 4),
                "step_last": round(self.step_last, 4),
                "it_s": round(self.it_s, 3),
                "time": time.time(),
            }
            write_atomic(self.path, json.dumps(record))
            self.last_write = now
            self.step_max = 0.0
        except Exception:  # a heartbeat must never break training
            pass

    def _step(self, train: bool = True) -> None:
        now = self.clock()
        dt = now - self.last_step
        self.last_step = now
        self.step_last = dt
        if self.state["batch"] == 0:
            return  # the first step of a pass includes worker start-up: not a step time
        self.step_max = max(self.step_max, dt)
        if train and dt > 0:
            self.it_s = 1.0 / dt if self.it_s == 0 else 0.9 * self.it_s + 0.1 / dt

    # Ultralytics callbacks -------------------------------------------------------------
    def on_train_epoch_start(self, trainer) -> None:
        self.state.update(
            epoch=trainer.epoch + 1, epochs=trainer.epochs, batch=0, batches=len(trainer.train_loader)
        )
        self.last_step = self.clock()
        self.write("train", force=True)

    def on_train_batch_end(self, trainer) -> None:
        self._step()
        self.state["batch"] += 1
        self.state["batches_total"] += 1
        self.write("train", force=self.state["batch"] == 1)  # the first batch of an epoch is always written

    def on_val_start(self, validator) -> None:
        try:
            batches = len(validator.dataloader)
        except Exception:
            batches = 0
        self.state.update(batch=0, batches=batches)
        self.last_step = self.clock()
        self.write("val", force=True)

    def on_val_batch_end(self, validator) -> None:
        self._step(train=False)
        self.state["batch"] += 1
        self.write("val", force=self.state["batch"] == 1)

    def on_model_save(self, trainer) -> None:
        self.write("save", force=True)

    def on_train_end(self, trainer) -> None:
        self.write("done", force=True)

    def callbacks(self) -> dict:
        return {
            "on_train_epoch_start": self.on_train_epoch_start,
            "on_train_batch_end": self.on_train_batch_end,
            "on_val_start": self.on_val_start,
            "on_val_batch_end": self.on_val_batch_end,
            "on_model_save": self.on_model_save,
            "on_train_end": self.on_train_end,
        }

