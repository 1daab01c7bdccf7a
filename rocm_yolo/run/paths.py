"""Every file name rocm-yolo uses, in one place.

:class:`RunPaths` owns the layout of one run directory (Ultralytics' ``runs/TASK/NAME``), as
submitit's ``JobPaths`` owns a job's folder: Ultralytics' own files (``weights/last.pt``,
``results.csv``), rocm-yolo's reports beside them (``rocm-yolo.log``, ``hang-K-stacks.txt``,
``crash-K.txt``, ``setup-K.txt``, ``internal-K.txt``) and its machinery in ``rocm_yolo/``
(specs, heartbeat, supervisor state, events, metrics, the child's stderr, tracker runs, the lock).
The user-level directories (the cache for the demo set, the conv self-test and MIOpen) are here too.

On more than one machine the run directory is on storage every node sees. The run's own files
(the weights, ``results.csv``, the tracker runs, the round every node agrees on) stay where they are;
each node keeps its own (spec, lock, heartbeats, stacks, log, events, supervisor state, its reports)
in ``rocm_yolo/node-K/``, K being rocm-yolo's node id. ``RunPaths(run_dir, node=K)`` gives them; the
processes of a node's tree get K from :data:`rocm_yolo.environment.NODE` when no node is named.

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


FROM_ENVIRONMENT = "environment"  # RunPaths' node: this process's, as its tree's ROCM_YOLO_NODE says


def node_from_environment(env: Mapping[str, str] = os.environ) -> int | None:
    value = env.get(environment.NODE, "")
    return int(value) if value.isdigit() else None


@dataclass(frozen=True)
class RunPaths:
    """The files of one run directory (of one node's share of it, on more than one machine). ``attempt`` numbers
    count on across resumes."""

    run_dir: Path
    node: int | None

    def __init__(self, run_dir: str | os.PathLike, node: int | None | str = FROM_ENVIRONMENT):
        object.__setattr__(self, "run_dir", Path(run_dir))
        object.__setattr__(self, "node", node_from_environment() if node == FROM_ENVIRONMENT else node)

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
    def reports(self) -> Path:
        """Where the log and the reports of hangs and errors go: the run directory, a node's folder on several."""
        return self.run_dir if self.node is None else self.node_dir

    @property
    def log(self) -> Path:
        return self.reports / "rocm-yolo.log"

    def hang_stacks(self, attempt: int) -> Path:
        return self.reports / f"hang-{attempt}-stacks.txt"

    def crash(self, attempt: int, rank: int | None = None) -> Path:
        return self.reports / f"crash-{attempt}{_rank_suffix(rank)}.txt"

    def setup_error(self, attempt: int, rank: int | None = None) -> Path:
        return self.reports / f"setup-{attempt}{_rank_suffix(rank)}.txt"

    def internal_error(self, attempt: int, rank: int | None = None) -> Path:
        return self.reports / f"internal-{attempt}{_rank_suffix(rank)}.txt"

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
        """rocm-yolo's folder of the run (every node's, on several machines)."""
        return self.run_dir / STATE_DIRNAME

    @property
    def node_dir(self) -> Path:
        """Where this node keeps its own files: ``rocm_yolo/node-K/`` on several machines, else ``rocm_yolo/``."""
        return self.state if self.node is None else self.state / f"node-{self.node}"

    def for_node(self, node: int | None) -> "RunPaths":
        return RunPaths(self.run_dir, node)

    def nodes(self) -> list[int]:
        """The nodes of a multi-node run that have a folder here."""
        found = []
        for p in self.state.glob("node-*"):
            number = p.name[len("node-") :]
            if number.isdigit() and p.is_dir():
                found.append(int(number))
        return sorted(found)

    def spec(self, attempt: int) -> Path:
        return self.node_dir / f"spec-{attempt}.json"

    def specs(self) -> list[Path]:
        """The spec files present, oldest attempt first."""
        found = []
        for p in self.node_dir.glob("spec-*.json"):
            number = p.stem[len("spec-") :]
            if number.isdigit():
                found.append((int(number), p))
        return [p for _, p in sorted(found)]

    @property
    def heartbeat(self) -> Path:
        return self.node_dir / "heartbeat.json"

    def heartbeat_of(self, rank: int | None) -> Path:
        """A rank's heartbeat file: rank 0's (or a single GPU's) is the run's, ``heartbeat.json``."""
        return self.heartbeat if not rank else self.node_dir / f"heartbeat-rank{rank}.json"

    @property
    def ranks_fifo(self) -> Path:
        """A multi-GPU run's FIFO: the ranks' heartbeat lines, which the launcher relays to the supervisor."""
        return self.node_dir / "ranks.fifo"

    def rank_heartbeats(self) -> list[tuple[int, Path]]:
        """The heartbeat files of a multi-GPU run's ranks above 0, by rank."""
        found = []
        for p in self.node_dir.glob("heartbeat-rank*.json"):
            number = p.stem[len("heartbeat-rank") :]
            if number.isdigit():
                found.append((int(number), p))
        return sorted(found)

    @property
    def supervisor(self) -> Path:
        return self.node_dir / "supervisor.json"

    @property
    def events(self) -> Path:
        return self.node_dir / "events.jsonl"

    def child_stderr(self, attempt: int) -> Path:
        """What the training child of ``attempt`` wrote to stderr (also shown on the terminal; bounded in size)."""
        return self.node_dir / f"child-{attempt}.stderr"

    @property
    def metrics(self) -> Path:
        """The run's Prometheus textfile (node_exporter's textfile collector reads it), written atomically."""
        return self.node_dir / "metrics.prom"

    @property
    def tracker(self) -> Path:
        """The run's MLflow and W&B runs, which every attempt continues (``trainer.callbacks.trackers``)."""
        return self.state / "tracker.json"

    @property
    def workers(self) -> Path:
        return self.node_dir / "workers.jsonl"

    @property
    def stacks(self) -> Path:
        return self.node_dir / "stacks"

    def trainer_stacks(self, pid: int) -> Path:
        return self.stacks / f"trainer-{pid}.txt"

    def worker_stacks(self, pid: int) -> Path:
        return self.stacks / f"worker-{pid}.txt"

    def forkserver(self, rank: int | None = None) -> Path:
        """Where a fork server records itself: ``forkserver.json``, ``forkserver-rankN.json`` for a rank above 0."""
        return self.node_dir / ("forkserver.json" if not rank else f"forkserver-rank{rank}.json")

    @property
    def torchrun_log(self) -> Path:
        """A multi-GPU run's log of torch's launcher (its banner, warnings, the failure table of a rank)."""
        return self.node_dir / "torchrun.log"

    @property
    def lock(self) -> Path:
        """Held (flock) by the supervisor of the run, of the node on several machines."""
        return self.node_dir / "lock"

    @property
    def rendezvous(self) -> Path:
        """On several machines: the round this node waits in at the rendezvous, rewritten while it waits."""
        return self.node_dir / "rendezvous.json"

    @property
    def alive(self) -> Path:
        """On several machines: this node's supervisor says it lives, a count rewritten every few seconds
        (``run.nodes.Liveness``)."""
        return self.node_dir / "alive.json"

    @property
    def round(self) -> Path:
        """On several machines: the round every node agrees on, and its profile (``run.nodes.Round``)."""
        return self.state / "round.json"

    @property
    def round_lock(self) -> Path:
        return self.state / "round.lock"

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
