"""The heartbeat: how the training child tells the supervisor (and ``rocm-yolo status``) it lives.

The writer is a set of ordinary Ultralytics callbacks. Each beat is one JSON record, sent
two ways: as a line down a pipe the supervisor gave the child (``ROCM_YOLO_HEARTBEAT_FD``),
which needs no disk, and into ``heartbeat.json`` in the run's rocm-yolo directory
(atomically), which ``rocm-yolo status`` reads from another terminal. It beats at most about
once a second, plus at every phase change (setup, train, val, save, done). Each record
carries a sequence number that grows with every event, so "no progress" is "no new sequence
number", whatever the clocks say. The per-batch cost is two ``time.monotonic()`` calls and a
compare.

A heartbeat file that cannot be written (a full or read-only disk) is said once, and is not
taken for a hang: the supervisor listens to the pipe. Readers return ``None`` for a missing,
half-written or badly typed record instead of raising.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

from rocm_yolo.fsutil import write_atomic

FD_ENV = "ROCM_YOLO_HEARTBEAT_FD"  # the write end of the supervisor's pipe, in the child
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


_TYPES = {f.name: (float if f.type == "float" else int if f.type == "int" else str) for f in fields(Heartbeat)}


def parse(text: str) -> Heartbeat | None:
    """A heartbeat from one JSON record, or None if it is not one (wrong keys or types)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != set(_TYPES):
        return None
    for key, kind in _TYPES.items():
        value = data[key]
        ok = isinstance(value, str) if kind is str else isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or (kind is int and float(value) != int(value)):
            return None
    return Heartbeat(**data)


def read(path: str | os.PathLike) -> Heartbeat | None:
    try:
        return parse(Path(path).read_text())
    except OSError:
        return None


class PipeReader:
    """The supervisor's end of the heartbeat pipe: the complete records written since the last read, without blocking.

    Every record counts, not only the newest: the first batch after a resume, say, tells where
    the attempt started, and a short rest of an epoch can be trained between two reads.
    """

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self.pending = b""

    def read(self) -> list[Heartbeat]:
        while self.fd >= 0:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:  # the child closed its end (exited)
                self.close()
                break
            self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        beats = (parse(line.decode("utf-8", "replace")) for line in lines)
        return [hb for hb in beats if hb is not None]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HeartbeatWriter:
    """Ultralytics callbacks that keep ``heartbeat.json`` current; they never raise."""

    def __init__(self, path: Path, attempt: int = 1, clock=time.monotonic, pipe_fd: int | None = None,
                 on_error: Callable[[str], None] | None = None):
        self.path = Path(path)
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
        }
        self.step_max = 0.0
        self.step_last = 0.0
        self.it_s = 0.0
        self.last_write = float("-inf")
        self.last_step = clock()
        self.pass_start = True  # the next step is the first of a pass (epoch, validation, resumed epoch)
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
            text = json.dumps(record)
            self._send(text)
            self._write_file(text)
            self.last_write = now
            self.step_max = 0.0
        except Exception:  # a heartbeat must never break training
            pass

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
                    self.on_error(f"cannot write the heartbeat file {self.path} ({self.file_error}); the watchdog "
                                  "still hears the trainer, but 'rocm-yolo status' shows the last progress written")

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

    # Ultralytics callbacks -------------------------------------------------------------
    def on_train_epoch_start(self, trainer) -> None:
        self.state.update(
            epoch=trainer.epoch + 1, epochs=trainer.epochs, batch=0, batches=len(trainer.train_loader)
        )
        self.last_step = self.clock()
        self.pass_start = True
        self.write("train", force=True)

    def resumed_at(self, batch: int) -> None:
        """The epoch continues after ``batch`` batches trained before a restart (a mid-epoch checkpoint)."""
        self.state["batch"] = batch
        self.write("train", force=True)

    def on_train_batch_end(self, trainer) -> None:
        first = self.pass_start
        self._step()
        self.state["batch"] += 1
        self.state["batches_total"] += 1
        self.write("train", force=first)  # the first batch of an epoch is always written

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
    value = os.environ.get(FD_ENV, "")
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    os.set_blocking(fd, False)
    return fd
