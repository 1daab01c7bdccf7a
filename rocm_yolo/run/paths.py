"""Every file name rocm-yolo uses, in one place.

:class:`RunPaths` owns the layout of one run directory (Ultralytics' ``runs/TASK/NAME``), as
submitit's ``JobPaths`` owns a job's folder: Ultralytics' own files (``weights/last.pt``,
``results.csv``), rocm-yolo's reports beside them (``rocm-yolo.log``, ``hang-K-stacks.txt``,
``crash-K.txt``, ``setup-K.txt``, ``internal-K.txt``) and its machinery in ``rocm_yolo/``
(specs, heartbeat, supervisor state, events, metrics, the child's stderr, tracker runs, the lock).
The user-level directories (the cache for the demo set, the conv self-test and MIOpen) are here too.

Nothing here touches the file system except :meth:`RunPaths.mid_checkpoints`, a glob.
This module imports nothing heavy: the CLI, the supervisor and DataLoader workers use it.
The variables that move the user-level directories are in :mod:`rocm_yolo.environment`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from rocm_yolo import environment
from rocm_yolo.environment import cache_dir

STATE_DIRNAME = "rocm_yolo"  # rocm-yolo's own files inside an Ultralytics run directory
GOOD_NAME = "last_good.pt"  # the verified copy of last.pt
_MID = re.compile(r"^ep(\d+)-ba(\d+)\.pt$")  # mid-epoch checkpoints: ep{EPOCH}-ba{BATCHES}.pt


@dataclass(frozen=True)
class RunPaths:
    """The files of one run directory. ``attempt`` numbers count on across resumes."""

    run_dir: Path

    def __init__(self, run_dir: str | os.PathLike):
        object.__setattr__(self, "run_dir", Path(run_dir))

    # Ultralytics' own files ------------------------------------------------------------
    @property
    def weights(self) -> Path:
        return self.run_dir / "weights"

    @property
    def last(self) -> Path:
        return self.weights / "last.pt"

    @property
    def best(self) -> Path:
        return self.weights / "best.pt"

    @property
    def results(self) -> Path:
        return self.run_dir / "results.csv"

    # rocm-yolo's files beside them -----------------------------------------------------
    @property
    def last_good(self) -> Path:
        return self.weights / GOOD_NAME

    @property
    def results_backup(self) -> Path:
        return self.run_dir / "results.before-resume.csv"

    @property
    def results_before(self) -> Path:
        """A reused directory's results.csv, kept aside while a new run starts (Ultralytics unlinks it)."""
        return self.run_dir / "results.before-run.csv"

    @property
    def log(self) -> Path:
        return self.run_dir / "rocm-yolo.log"

    def hang_stacks(self, attempt: int) -> Path:
        return self.run_dir / f"hang-{attempt}-stacks.txt"

    def crash(self, attempt: int, rank: int | None = None) -> Path:
        return self.run_dir / f"crash-{attempt}{_rank_suffix(rank)}.txt"

    def setup_error(self, attempt: int, rank: int | None = None) -> Path:
        return self.run_dir / f"setup-{attempt}{_rank_suffix(rank)}.txt"

    def internal_error(self, attempt: int, rank: int | None = None) -> Path:
        return self.run_dir / f"internal-{attempt}{_rank_suffix(rank)}.txt"

    def mid_checkpoint(self, epoch: int, batches: int) -> Path:
        """A mid-epoch checkpoint: ``batches`` batches of epoch ``epoch`` (1-based) done."""
        return self.weights / f"ep{epoch}-ba{batches}.pt"

    def mid_checkpoints(self) -> list[tuple[int, int, Path]]:
        """The mid-epoch checkpoints present, as (epoch, batches, path), oldest position first."""
        found = []
        try:
            entries = list(self.weights.iterdir())
        except OSError:
            return []
        for p in entries:
            m = _MID.match(p.name)
            if m:
                found.append((int(m[1]), int(m[2]), p))
        return sorted(found)

    def checkpoints(self) -> list[Path]:
        """Every checkpoint a resume could continue from that is present: last.pt, its verified copy, mid-epoch ones."""
        return [p for p in (self.last, self.last_good) if p.exists()] + [p for _, _, p in self.mid_checkpoints()]

    # rocm-yolo's machinery -------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.run_dir / STATE_DIRNAME

    def spec(self, attempt: int) -> Path:
        return self.state / f"spec-{attempt}.json"

    def specs(self) -> list[Path]:
        """The spec files present, oldest attempt first."""
        found = []
        for p in self.state.glob("spec-*.json"):
            number = p.stem[len("spec-") :]
            if number.isdigit():
                found.append((int(number), p))
        return [p for _, p in sorted(found)]

    @property
    def heartbeat(self) -> Path:
        return self.state / "heartbeat.json"

    def heartbeat_of(self, rank: int | None) -> Path:
        """A rank's heartbeat file: rank 0's (or a single GPU's) is the run's, ``heartbeat.json``."""
        return self.heartbeat if not rank else self.state / f"heartbeat-rank{rank}.json"

    @property
    def ranks_fifo(self) -> Path:
        """A multi-GPU run's FIFO: the ranks' heartbeat lines, which the launcher relays to the supervisor."""
        return self.state / "ranks.fifo"

    def rank_heartbeats(self) -> list[tuple[int, Path]]:
        """The heartbeat files of a multi-GPU run's ranks above 0, by rank."""
        found = []
        for p in self.state.glob("heartbeat-rank*.json"):
            number = p.stem[len("heartbeat-rank") :]
            if number.isdigit():
                found.append((int(number), p))
        return sorted(found)

    @property
    def supervisor(self) -> Path:
        return self.state / "supervisor.json"

    @property
    def events(self) -> Path:
        return self.state / "events.jsonl"

    def child_stderr(self, attempt: int) -> Path:
        """What the training child of ``attempt`` wrote to stderr (also shown on the terminal; bounded in size)."""
        return self.state / f"child-{attempt}.stderr"

    @property
    def metrics(self) -> Path:
        """The run's Prometheus textfile (node_exporter's textfile collector reads it), written atomically."""
        return self.state / "metrics.prom"

    @property
    def tracker(self) -> Path:
        """The run's MLflow and W&B runs, which every attempt continues (``trainer.callbacks.trackers``)."""
        return self.state / "tracker.json"

    @property
    def workers(self) -> Path:
        return self.state / "workers.jsonl"

    @property
    def stacks(self) -> Path:
        return self.state / "stacks"

    def trainer_stacks(self, pid: int) -> Path:
        return self.stacks / f"trainer-{pid}.txt"

    def worker_stacks(self, pid: int) -> Path:
        return self.stacks / f"worker-{pid}.txt"

    def forkserver(self, rank: int | None = None) -> Path:
        """Where a fork server records itself: ``forkserver.json``, ``forkserver-rankN.json`` for a rank above 0."""
        return self.state / ("forkserver.json" if not rank else f"forkserver-rank{rank}.json")

    @property
    def torchrun_log(self) -> Path:
        """A multi-GPU run's log of torch's launcher (its banner, warnings, the failure table of a rank)."""
        return self.state / "torchrun.log"

    @property
    def lock(self) -> Path:
        return self.state / "lock"

    def fault_fired(self, kind: str) -> Path:
        """The marker that fault ``kind`` has fired in this run (faults fire once per run)."""
        return self.state / f"fault-{kind}.fired"

    def fault_trigger_of(self, rank: int | None) -> Path:
        """The file whose existence makes ``worker-hang``'s workers block (one per rank of a multi-GPU run)."""
        return self.state / ("fault.trigger" if not rank else f"fault-rank{rank}.trigger")


def _rank_suffix(rank: int | None) -> str:
    """A multi-GPU run's ranks above 0 keep their own files (rank 0's, and a one-GPU run's, are the run's)."""
    return f"-rank{rank}" if rank else ""


# --------------------------------------------------------------------------- user level


def demo_dir(version: int, env: Mapping[str, str] = os.environ) -> Path:
    """Where the demo data set lives: ``$ROCM_YOLO_DEMO_DIR`` or ``demo-vN`` in the cache."""
    if env.get(environment.DEMO_DIR):
        return Path(env[environment.DEMO_DIR]).expanduser()
    return cache_dir(env) / f"demo-v{version}"


def miopen_dir(arch: str, override: str, env: Mapping[str, str] = os.environ) -> Path:
    """A per-user MIOpen database and kernel cache, one per (architecture, HSA override)."""
    return cache_dir(env) / "miopen" / (f"{arch}-hsa{override}" if override else arch)
