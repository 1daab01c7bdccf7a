"""``supervisor.json``: the state of a run as its supervisor last wrote it, one typed record.

The supervisor writes a :class:`SupervisorState` (atomically) at every change of attempt,
state or recovery; ``rocm-yolo status`` and a resumed run's supervisor read it back. A reader
gets ``None`` for a file that is missing, unreadable or badly typed, never an exception.
:class:`RunState` is the vocabulary of a run's states, the file's ``state`` (an attempt's states, and how they end
the run: :mod:`rocm_yolo.supervisor.states`).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from rocm_yolo.run.atomic import private_dirs, write_atomic
from rocm_yolo.run.paths import RunPaths


class RunState(str, Enum):
    """A run's state, as ``supervisor.json`` and :class:`~rocm_yolo.supervisor.states.RunResult` hold it: running,
    then how it ended."""

    RUNNING = "running"
    FINISHED = "finished"  # every epoch trained
    FAILED = "failed"  # no restarts left
    USAGE_ERROR = "usage_error"  # bad data or arguments
    SETUP_FAILED = "setup_failed"  # the environment: a restart would meet it again
    INTERNAL_ERROR = "internal_error"  # a rocm-yolo bug
    INTERRUPTED = "interrupted"  # SIGINT, SIGTERM or SIGHUP to the supervisor


def _typed(cls, data: Any):
    """``cls(**data)`` when every field of ``data`` has its declared type (ints for floats too), else None."""
    if not isinstance(data, dict):
        return None
    values = _typed_fields(fields(cls), data)
    return None if values is None else cls(**values)


def _typed_fields(wanted, data: dict) -> dict | None:
    """The values of ``data`` for the dataclass fields ``wanted``, each of its declared type (an optional one may be
    missing); None when one is missing or badly typed."""
    values = {}
    for f in wanted:
        if f.name not in data:
            if f.default is not MISSING or f.default_factory is not MISSING:  # optional
                continue
            return None
        value = data[f.name]
        kinds = _KINDS.get(f.type, (object,))
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            return None
        values[f.name] = value
    return values


_KINDS = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "int | None": (int, type(None)),
    "float | None": (int, float, type(None)),
    "str | None": (str, type(None)),
    "list | None": (list, type(None)),
}


@dataclass
class Hang:
    """A hang the watchdog found: where the run was last heard, for how long, and where its stacks went."""

    epoch: int | None
    batch: int | None
    phase: str | None
    stalled_seconds: float
    stacks: str | None
    detected: float  # wall clock
    cls: str | None = None  # what the watchdog found it was (diagnosis.diagnose: loader, gpu-hang, collective, ...)
    signature: str | None = None  # what makes two failures the same


@dataclass
class Recovery:
    """One restart: where the failed attempt was, where the next one resumed, and what that cost."""

    attempt: int  # the attempt that resumed
    cause: str  # hang | crash
    lost_at: list | None  # [epoch, batches done in it] when the failed attempt was last heard (1-based epoch)
    resumed_at: list | None  # where the new attempt resumed
    batches: int  # batches per epoch
    checkpoint: str | None  # the checkpoint it resumed from
    retrained_batches: int | None  # batches trained again (None: not comparable)
    detect_seconds: float
    restart_seconds: float
    retrain_seconds: float
    failure: str | None = None  # the class of the failure it recovered from (diagnosis.diagnose)


@dataclass
class Failure:
    """A hang or a crash as the watchdog diagnosed it, and what it did about it."""

    attempt: int
    kind: str  # hang | crash
    cls: str  # loader, gpu-fault, gpu-hang, gpu-oom, host-oom, collective, training-error, data-error, unknown
    title: str  # how rocm-yolo's line named it
    signature: str  # what makes two failures the same (class and the fault's own words)
    epoch: int | None  # where the run was last heard (1-based epoch)
    batch: int | None
    phase: str | None
    detected: float  # wall clock
    report: str | None = None  # RUN/crash-K.txt or RUN/hang-K-stacks.txt, with the diagnosis and its evidence
    evidence: list | None = None  # the lines that decided the class
    remedy: str | None = None  # ladder | same | p2p-off | stop (diagnosis.remedies)
    weak: bool = False  # the class was read from context alone: it counted toward no stop


@dataclass
class Still:
    """A start-up whose processes have not moved (CPU time, I/O) since ``since``, or were stopped from outside."""

    since: float  # wall clock
    stopped: bool  # stopped (state T or t) by someone else than the supervisor's own job control
    pids: list | None = None  # the processes stopped


@dataclass(frozen=True)
class WatchdogSettings:
    """The watchdog settings a run's supervisor ran with (``status`` judges a stall as it would)."""

    enabled: bool
    stall_timeout: float
    step_multiplier: float
    startup_grace: float


@dataclass
class SupervisorState:
    """The run as its supervisor knows it: the one record its loop changes, ``supervisor.json`` holds and, with the
    exit code, :class:`rocm_yolo.supervisor.states.RunResult` returns."""

    state: RunState = RunState.RUNNING
    supervisor_pid: int = 0
    child_pid: int | None = None
    attempt: int = 1  # counted on across resumes
    profile: str = ""
    restarts: int = 0
    max_restarts: int = 0
    lost_seconds: float = 0.0  # to hangs: detection, restart and batches trained again
    started: float = 0.0  # wall clock
    updated: float = 0.0
    wall_seconds: float = 0.0  # from the supervisor's start to the run's end
    suspended_seconds: float = 0.0  # of them, stopped by Ctrl-Z or SIGTTOU (the whole tree stopped: no training)
    hangs: list = field(default_factory=list)  # [Hang]
    recoveries: list = field(default_factory=list)  # [Recovery]
    watchdog: WatchdogSettings | None = None
    detail: str | None = None  # what else the end says (e.g. "the final validation was interrupted")
    failures: list = field(default_factory=list)  # [Failure], each diagnosed (a resumed run's earlier ones first)
    verdict: list | None = None  # why the run stopped without retrying, and the known fixes (lines)
    still: Still | None = None  # the attempt's start-up has not moved, or was stopped from outside (status says it)

    # what every supervisor.json has held: a file without one of them is not the record
    REQUIRED = ("supervisor_pid", "child_pid", "attempt", "profile", "restarts", "max_restarts", "lost_seconds")

    @property
    def running(self) -> bool:
        return self.state == RunState.RUNNING

    def to_dict(self) -> dict:
        out = asdict(self)
        out["state"] = self.state.value
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "SupervisorState | None":
        """The record of ``data``, or None if a field is missing or badly typed."""
        if not isinstance(data, dict):
            return None
        try:
            state = RunState(data.get("state"))
        except ValueError:
            return None
        if not all(name in data for name in ("started", "updated", *SupervisorState.REQUIRED)):
            return None
        plain = [f for f in fields(SupervisorState) if f.type in _KINDS and f.name not in ("detail", "verdict")]
        scalars = _typed_fields(plain, data)
        detail = data.get("detail")
        hangs, recoveries = data.get("hangs") or [], data.get("recoveries") or []
        if scalars is None or not isinstance(hangs, list) or not isinstance(recoveries, list):
            return None
        failures = data.get("failures") or []
        verdict = data.get("verdict")
        return cls(
            state=state,
            hangs=_each(Hang, hangs),  # a damaged entry costs only itself
            recoveries=_each(Recovery, recoveries),
            watchdog=_typed(WatchdogSettings, data["watchdog"]) if isinstance(data.get("watchdog"), dict) else None,
            failures=_each(Failure, failures) if isinstance(failures, list) else [],
            verdict=[str(x) for x in verdict] if isinstance(verdict, list) else None,
            detail=detail if isinstance(detail, str) else None,
            still=_typed(Still, data["still"]) if isinstance(data.get("still"), dict) else None,
            **scalars,
        )


def _each(cls, items: list) -> list:
    return [x for x in (_typed(cls, item) for item in items) if x is not None]


def _paths(run: str | os.PathLike | RunPaths) -> RunPaths:
    return run if isinstance(run, RunPaths) else RunPaths(run)


def write_state(run: str | os.PathLike | RunPaths, state: SupervisorState) -> None:
    """Write ``state`` as the run's (a run directory, or a node's :class:`RunPaths`); OSError when the disk refuses
    (the caller decides)."""
    paths = _paths(run)
    private_dirs(paths.state, paths.node_dir)
    write_atomic(paths.supervisor, json.dumps(state.to_dict()))


def read_state(run: str | os.PathLike | RunPaths) -> SupervisorState | None:
    """``supervisor.json`` of a run directory (or of a node's :class:`RunPaths`), or None if missing, unreadable or
    badly typed."""
    try:
        data = json.loads(_paths(run).supervisor.read_text())
    except (OSError, ValueError):
        return None
    return SupervisorState.from_dict(data)
