"""The states of an attempt and of a run, how each ends the process, and ``RunResult``.

States of an attempt::

    STARTING --first training batch--> HEALTHY --exit 0--> SUCCEEDED
       |  |                              |--no progress for the stall timeout--> STALLED
       |  '--exit 2/3/4/123: USAGE_ERROR, ALREADY_FINISHED, SETUP_FAILED, INTERNAL_ERROR
       |                                 '--any other exit------------------------> CRASHED
       '--no heartbeat within the startup grace--> STALLED
    any state --SIGINT/SIGTERM/SIGHUP--> INTERRUPTED
    STALLED/CRASHED --restarts left--> next attempt (next profile)   else: FAILED

The run ends in FINISHED, FAILED, USAGE_ERROR, SETUP_FAILED (the environment: a broken
torch, a full or read-only disk; never retried), INTERNAL_ERROR or INTERRUPTED, which is
``RunResult.state`` and the ``state`` of ``supervisor.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from rocm_yolo import errors
from rocm_yolo.run.paths import RunPaths


class State(str, Enum):
    # an attempt
    STARTING = "starting"  # child started, no training batch yet
    HEALTHY = "healthy"  # heartbeat progressing
    SUCCEEDED = "succeeded"  # exit 0
    STALLED = "stalled"  # no progress for the stall timeout
    CRASHED = "crashed"  # exited with an error during training
    ALREADY_FINISHED = "already_finished"  # the checkpoint's run has trained all its epochs
    # the run (and an attempt that ends it)
    RUNNING = "running"
    FINISHED = "finished"  # every epoch trained
    FAILED = "failed"  # no restarts left
    USAGE_ERROR = "usage_error"  # bad data or arguments
    SETUP_FAILED = "setup_failed"  # the environment: a restart would meet it again
    INTERNAL_ERROR = "internal_error"  # a rocm-yolo bug
    INTERRUPTED = "interrupted"  # SIGINT, SIGTERM or SIGHUP to the supervisor


# How the child's exit code ends an attempt (any other code: CRASHED).
EXIT_STATES = {
    errors.OK: State.SUCCEEDED,
    errors.USAGE: State.USAGE_ERROR,
    errors.CHILD_FINISHED: State.ALREADY_FINISHED,
    errors.SETUP: State.SETUP_FAILED,
    errors.INTERNAL: State.INTERNAL_ERROR,
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
class RunResult:
    state: State  # RUNNING until the run ends; then FINISHED, FAILED, USAGE_ERROR, ... (see State)
    exit_code: int
    run_dir: str
    attempts: int = 1
    restarts: int = 0
    hangs: list = field(default_factory=list)
    lost_seconds: float = 0.0  # to hangs: detection + restart + batches trained again
    wall_seconds: float = 0.0
    recoveries: list = field(default_factory=list)  # one record per restart (supervisor.worklost)

    @property
    def last(self) -> Path:
        return RunPaths(self.run_dir).last

    @property
    def best(self) -> Path:
        return RunPaths(self.run_dir).best
