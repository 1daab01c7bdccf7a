"""The states of an attempt and of a run, how each ends the process, and ``RunResult``.

States of an attempt (:class:`AttemptState`)::

    STARTING --first training batch--> HEALTHY --exit 0--> SUCCEEDED
       |  |                              |--no progress for the stall timeout--> STALLED
       |  '--exit 2/3/4/123: USAGE_ERROR, ALREADY_FINISHED, SETUP_FAILED, INTERNAL_ERROR; 6: FAILED (a node
       |     of a multi-node run did not come to the rendezvous); 7: REGROUP (a node waits in a later round)
       |                                 '--any other exit------------------------> CRASHED
       '--no heartbeat within the start-up allowance (the stall timeout once the loader is iterated for the
          first batch)--> STALLED
    any state --SIGINT/SIGTERM/SIGHUP--> INTERRUPTED
    STALLED/CRASHED --restarts left--> next attempt (next profile)   else: FAILED
    REGROUP, or STALLED/CRASHED with another node gone --> next round, same profile, no restart spent

The run (:class:`~rocm_yolo.run.supervisor_state.RunState`, the ``state`` of ``supervisor.json`` and
``RunResult.state``) is RUNNING, then ends in FINISHED, FAILED, USAGE_ERROR, SETUP_FAILED (the environment: a broken
torch, a full or read-only disk; never retried), INTERNAL_ERROR or INTERRUPTED. An attempt that ends in one of the
last four, or in FAILED, ends the run in it (:attr:`AttemptState.run_end`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from rocm_yolo import errors
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import RunState, SupervisorState


class AttemptState(str, Enum):
    """An attempt's state: how it is going, or how it ended."""

    STARTING = "starting"  # child started, no training batch yet
    HEALTHY = "healthy"  # heartbeat progressing
    SUCCEEDED = "succeeded"  # exit 0
    STALLED = "stalled"  # no progress for the stall timeout
    CRASHED = "crashed"  # exited with an error during training
    ALREADY_FINISHED = "already_finished"  # the checkpoint's run has trained all its epochs
    REGROUP = "regroup"  # several machines: the nodes meet again in a later round (a node joins, or one is lost)
    # the ends it shares with the run: the run ends so too
    FAILED = RunState.FAILED.value  # several machines: a node did not come to the rendezvous
    USAGE_ERROR = RunState.USAGE_ERROR.value  # bad data or arguments
    SETUP_FAILED = RunState.SETUP_FAILED.value  # the environment: a restart would meet it again
    INTERNAL_ERROR = RunState.INTERNAL_ERROR.value  # a rocm-yolo bug
    INTERRUPTED = RunState.INTERRUPTED.value  # SIGINT, SIGTERM or SIGHUP to the supervisor

    @property
    def run_end(self) -> RunState | None:
        """The run's state when this end of an attempt is the run's end too, else None."""
        return RunState(self.value) if self.value in _RUN_VALUES else None


_RUN_VALUES = frozenset(state.value for state in RunState)

# How the child's exit code ends an attempt (any other code: CRASHED).
EXIT_STATES = {
    errors.OK: AttemptState.SUCCEEDED,
    errors.USAGE: AttemptState.USAGE_ERROR,
    errors.CHILD_FINISHED: AttemptState.ALREADY_FINISHED,
    errors.SETUP: AttemptState.SETUP_FAILED,
    errors.INTERNAL: AttemptState.INTERNAL_ERROR,
    errors.NODES_MISSING: AttemptState.FAILED,  # a node did not come to the rendezvous: no restart meets it either
    errors.REGROUP: AttemptState.REGROUP,  # a node waits in a later round: the nodes meet there
}
# How a run that ends in a state exits.
RUN_EXIT = {
    RunState.FINISHED: errors.OK,
    RunState.FAILED: errors.FAILED,
    RunState.USAGE_ERROR: errors.USAGE,
    RunState.SETUP_FAILED: errors.SETUP,
    RunState.INTERNAL_ERROR: errors.INTERNAL,
}


@dataclass
class RunResult(SupervisorState):
    """How a run ended: the supervisor's one record (:class:`~rocm_yolo.run.supervisor_state.SupervisorState`, as
    ``supervisor.json`` holds it) and the exit code, with where the run is."""

    exit_code: int = errors.FAILED
    run_dir: str = ""
    node: int | None = None  # on more than one machine: the node this supervisor ran (its log is its own)

    @property
    def attempts(self) -> int:
        return self.attempt

    @property
    def running_seconds(self) -> float:
        """The run's time, less the time it was stopped by Ctrl-Z: what "done: ... in N s" says."""
        return max(self.wall_seconds - self.suspended_seconds, 0.0)

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.run_dir, self.node)

    @property
    def last(self) -> Path:
        return RunPaths(self.run_dir).last

    @property
    def best(self) -> Path:
        return RunPaths(self.run_dir).best
