"""Fault injection for tests and benchmarks: real hangs, real crashes, on request.

Set ``ROCM_YOLO_FAULT=KIND[@EPOCH:BATCH]`` in the environment of a training run:

- ``worker-hang``: a DataLoader worker blocks forever in ``__getitem__`` (the trainer then
  waits forever for its batch, as in the users' hangs);
- ``main-hang``: the trainer's main thread blocks forever after a batch;
- ``crash``: the trainer raises ``RuntimeError`` after a batch.

``@EPOCH:BATCH`` (1-based) says when; without it a worker hang starts at the first item.
A fault fires once per run directory (a marker file records it), so the run that the
watchdog restarts is healthy. Nothing here is active unless the variable is set.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

ENV = "ROCM_YOLO_FAULT"
TRIGGER_ENV = "ROCM_YOLO_FAULT_TRIGGER"  # file whose existence tells workers to hang (set by the child)
KINDS = ("worker-hang", "main-hang", "crash")


@dataclass(frozen=True)
class Fault:
    kind: str
    epoch: int | None = None
    batch: int | None = None


def parse(text: str | None) -> Fault | None:
    if not text:
        return None
    kind, _, when = text.strip().partition("@")
    if kind not in KINDS:
        raise ValueError(f"{ENV}={text!r}: unknown fault '{kind}', choose one of {', '.join(KINDS)}")
    if not when:
        return Fault(kind)
    epoch, _, batch = when.partition(":")
    return Fault(kind, int(epoch), int(batch or 1))


def block_forever() -> None:
    """A real hang: the calling thread waits on an event nobody sets."""
    threading.Event().wait()


def arm_worker(dataset) -> None:
    """In a DataLoader worker: make this worker's ``__getitem__`` hang once the trigger exists."""
    fault = parse(os.environ.get(ENV))
    if fault is None or fault.kind != "worker-hang" or dataset is None:
        return
    trigger = os.environ.get(TRIGGER_ENV) if fault.epoch is not None else None
    cls = type(dataset)
    original = cls.__getitem__

    def __getitem__(self, index):
        if trigger is None or os.path.exists(trigger):
            block_forever()
        return original(self, index)

    cls.__getitem__ = __getitem__  # this worker process only: it is a separate interpreter


class Injector:
    """Trainer side: Ultralytics callbacks that fire the fault at EPOCH:BATCH, once per run."""

    def __init__(self, fault: Fault, state_dir: Path):
        self.fault = fault
        self.fired_marker = state_dir / "fault.fired"
        self.trigger = state_dir / "fault.trigger"
        self.batch = 0
        self.trigger.unlink(missing_ok=True)  # a restarted run starts with healthy workers
        os.environ[TRIGGER_ENV] = str(self.trigger)

    def on_train_epoch_start(self, trainer) -> None:
        self.batch = 0

    def on_train_batch_end(self, trainer) -> None:
        self.batch += 1
        f = self.fault
        if f.epoch is None or (trainer.epoch + 1, self.batch) != (f.epoch, f.batch) or self.fired_marker.exists():
            return
        self.fired_marker.write_text(f"{f.kind} at epoch {f.epoch} batch {f.batch}\n")
        if f.kind == "worker-hang":
            self.trigger.write_text("hang\n")
        elif f.kind == "main-hang":
            block_forever()
        elif f.kind == "crash":
            raise RuntimeError(f"injected crash ({ENV}) at epoch {f.epoch} batch {f.batch}")

    def callbacks(self) -> dict:
        return {"on_train_epoch_start": self.on_train_epoch_start, "on_train_batch_end": self.on_train_batch_end}
