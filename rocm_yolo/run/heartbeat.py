"""The pipe protocol: how the training child tells the supervisor (and ``rocm-yolo status``) it lives.

Three kinds of line go down the pipe the supervisor gave the child
(:data:`rocm_yolo.environment.HEARTBEAT_FD`), each one write of less than ``PIPE_BUF``:

- a **heartbeat record** (:class:`Heartbeat`, JSON), also written into ``heartbeat.json`` in the
  run's rocm-yolo directory (atomically), which ``rocm-yolo status`` reads from another terminal.
  Each record carries a sequence number that grows with every event, so "no progress" is "no
  new sequence number", whatever the clocks say;
- a **position line** (:func:`position_line`, ``P seq epoch batch total time``): a training batch
  finished between two records, in a few bytes;
- on several GPUs, a rank's **start line** (:func:`start_line`, ``S RANK``), its first, and its **exit
  line** (:func:`exit_line`, ``X RANK CODE``), its last. The launcher keeps the start lines; it keeps the
  exit lines for its outcome and relays them: from the first one, the supervisor knows the attempt is ending.

The writer is :mod:`rocm_yolo.trainer.callbacks.heartbeat_writer` (Ultralytics callbacks), the pipe's
reader :class:`rocm_yolo.supervisor.trainer_process.PipeReader`, the ranks' relay
:class:`rocm_yolo.ddp.relay.Relay`. Readers get ``None`` for a missing, half-written or
badly typed line instead of an exception.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

MIN_INTERVAL = 1.0  # seconds between writes inside one phase

# What an attempt does before its first trained batch (:attr:`Heartbeat.startup`), in order: what is slow before
# training has its start-up allowance, but a loader iterated for its first batch is waited for as for any other.
DATA = "data"  # Ultralytics' trainer made: the data set checked, scanned and cached, the model and the loaders built
WORKERS = "workers"  # the train loader iterated: spawned workers start, each importing torch (seconds each)
FIRST_BATCH = "first-batch"  # the train loader iterated for its first batch: its workers start at once and load it
FIRST_STEP = "first-step"  # the first batch in hand: the first step (on a GPU, its kernels found and tuned)
STEPS = {
    "": "starting",
    DATA: "checking the data set, building the model and the loaders",
    WORKERS: "starting the train loader's spawned workers",
    FIRST_BATCH: "waiting for the first batch from the train loader",
    FIRST_STEP: "the first training step (GPU kernel tuning)",
}


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
    rank: int = 0  # the DDP rank that wrote it (0 on one GPU); rank 0 speaks for the run
    local_rank: int = 0  # its rank among its node's ranks: local rank 0 speaks for its node to the node's supervisor
    startup: str = ""  # before the attempt's first trained batch, what it does (one of STEPS); "" after
    world: int = 1  # the ranks the attempt trains on (torch's WORLD_SIZE; 1 on one GPU)

    @property
    def lead(self) -> bool:
        """Whether it speaks for its node (the run, on one machine): where it is, what a restart trains again."""
        return self.local_rank == 0


_TYPES = {f.name: (float if f.type == "float" else int if f.type == "int" else str) for f in fields(Heartbeat)}


def parse(text: str | bytes) -> Heartbeat | None:
    """A heartbeat from one JSON record, or None if it is not one (wrong keys or types)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data.setdefault("rank", 0)  # a record of a version before multi-GPU runs
    data.setdefault("local_rank", data["rank"])  # a record of a version before multi-node runs
    data.setdefault("startup", "")  # a record of a version before start-up steps
    data.setdefault("world", 1)  # a record of a version before a run could change its GPUs
    if set(data) != set(_TYPES):
        return None
    for key, kind in _TYPES.items():
        value = data[key]
        ok = isinstance(value, str) if kind is str else isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or (kind is int and float(value) != int(value)):
            return None
    return Heartbeat(**data)


POSITION_PREFIX = "P "


def position_line(seq: int, epoch: int, batch: int, batches_total: int, wall: float) -> str:
    """A training batch finished between two heartbeat records: ``P seq epoch batch batches_total time``."""
    return f"{POSITION_PREFIX}{seq} {epoch} {batch} {batches_total} {wall:.3f}"


def apply_position(last: Heartbeat, text: str) -> Heartbeat | None:
    """``last`` moved on to the batch a position line reports (a new event: a new sequence number), or None."""
    parts = text.split()
    try:
        seq, epoch, batch, total, wall = int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]), float(parts[5])
    except (IndexError, ValueError):
        return None
    if len(parts) != 6 or parts[0] != POSITION_PREFIX.strip():
        return None
    return replace(last, seq=seq, phase="train", epoch=epoch, batch=batch, batches_total=total, time=wall, step_max=0.0)


START_PREFIX = "S "  # on several GPUs, a rank's first line: "S RANK" (the ranks of this node run)


def start_line(rank: int) -> str:
    """A rank's first line down the launcher's FIFO: it runs (on more than one machine: the nodes met)."""
    return f"{START_PREFIX}{rank}"


EXIT_PREFIX = "X "  # on several GPUs, a rank's last line: "X RANK CODE"


def exit_line(rank: int, code: int) -> str:
    """A rank's last line down the launcher's FIFO: the exit code it ends with."""
    return f"{EXIT_PREFIX}{rank} {code}"


def parse_exit(text: str) -> tuple[int, int] | None:
    """``(rank, code)`` of an exit line, or None if ``text`` is not one."""
    parts = text.split()
    if len(parts) == 3 and parts[0] == EXIT_PREFIX.strip() and parts[1].isdigit() and parts[2].lstrip("-").isdigit():
        return int(parts[1]), int(parts[2])
    return None


def read(path: str | os.PathLike) -> Heartbeat | None:
    try:
        return parse(Path(path).read_text())
    except OSError:
        return None
