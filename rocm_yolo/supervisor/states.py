"""The states of an attempt and of a run, how each ends the process, and ``RunResult``.

States of an attempt::

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

The run ends in FINISHED, FAILED, USAGE_ERROR, SETUP_FAILED (the environment: a broken
torch, a full or read-only disk; never retried), INTERNAL_ERROR or INTERRUPTED, which is
``RunResult.state`` and the ``state`` of ``supervisor.json``. :class:`State` itself is part of
that file's record (:mod:`rocm_yolo.run.supervisor_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocm_yolo import errors
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import State, SupervisorState

# How the child's exit code ends an attempt (any other code: CRASHED).
EXIT_STATES = {
    errors.OK: State.SUCCEEDED,
    errors.USAGE: State.USAGE_ERROR,
    errors.CHILD_FINISHED: State.ALREADY_FINISHED,
    errors.SETUP: State.SETUP_FAILED,
    errors.INTERNAL: State.INTERNAL_ERROR,
    errors.NODES_MISSING: State.FAILED,  # a node did not come to the rendezvous: no restart meets it either
    errors.REGROUP: State.REGROUP,  # a node waits in a later round: the nodes meet there
}
# How a run that ends in a state exits.
RUN_EXIT = {
    State.FINISHED: errors.OK,
    State.FAILED: errors.FAILED,
    State.USAGE_ERROR: errors.USAGE,
    State.SETUP_FAILED: errors.SETUP,
    State.INTERNAL_ERROR: errors.INTERNAL,
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
