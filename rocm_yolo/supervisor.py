"""The supervisor: run the training child, notice when it stalls or dies, recover.

One monitor loop, one decision per tick: the child is healthy (keep watching), finished
(done), made a user error (give up, exit 2), or stalled/crashed (spend a restart: dump the
stacks, kill the whole tree, resume ``last.pt`` on the next profile of the fallback
ladder). States of an attempt::

    STARTING --first training batch--> HEALTHY --exit 0--> SUCCEEDED
       |  |                              |--no progress for the stall timeout--> STALLED
       |  '--exit 2/3/4: USAGE_ERROR, ALREADY_FINISHED, SETUP_FAILED (never retried)
       |                                 '--any other exit------------------------> CRASHED
       '--no heartbeat within the startup grace--> STALLED
    any state --SIGINT/SIGTERM--> INTERRUPTED
    STALLED/CRASHED --restarts left--> next attempt (next profile)   else: exit 1

The process machinery sits behind :class:`ChildProcess`, so tests drive the loop with
scripted heartbeats and a fake clock; end-to-end tests use the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from rocm_yolo import checkpoints, exitcodes, heartbeat, proctree
from rocm_yolo.heartbeat import Heartbeat
from rocm_yolo.log import RunLog
from rocm_yolo.profiles import DEFAULT_LADDER, UsageError, next_profile, resolve
from rocm_yolo.spec import STATE_DIRNAME, RunSpec


class State(str, Enum):
    STARTING = "starting"  # child started, no training batch yet
    HEALTHY = "healthy"  # heartbeat progressing
    SUCCEEDED = "succeeded"  # exit 0
    STALLED = "stalled"  # no progress for the stall timeout
    CRASHED = "crashed"  # exited with an error during training
    USAGE_ERROR = "usage_error"  # bad data or arguments
    ALREADY_FINISHED = "already_finished"  # the checkpoint's run has trained all its epochs
    SETUP_FAILED = "setup_failed"  # an error before training started: a restart would meet it again
    INTERRUPTED = "interrupted"  # SIGINT or SIGTERM to the supervisor


EXIT_STATES = {
    exitcodes.OK: State.SUCCEEDED,
    exitcodes.USAGE: State.USAGE_ERROR,
    exitcodes.CHILD_FINISHED: State.ALREADY_FINISHED,
    exitcodes.CHILD_SETUP_FAILED: State.SETUP_FAILED,
}


@dataclass(frozen=True)
class WatchdogConfig:
    enabled: bool = True
    stall_timeout: float = 180.0  # floor, seconds
    step_multiplier: float = 10.0  # timeout is at least this many slowest recent steps
    startup_grace: float = 900.0  # before the first training batch of an attempt (scan, cache, kernel tuning)
    max_restarts: int = 3
    ladder: tuple[str, ...] = DEFAULT_LADDER
    poll_interval: float = 0.5
    term_timeout: float = 8.0
    kill_timeout: float = 4.0


@dataclass
class RunResult:
    state: str  # finished | failed | usage_error | interrupted
    exit_code: int
    run_dir: str
    attempts: int = 1
    restarts: int = 0
    hangs: list = field(default_factory=list)
    lost_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def last(self) -> Path:
        return Path(self.run_dir) / "weights" / "last.pt"

    @property
    def best(self) -> Path:
        return Path(self.run_dir) / "weights" / "best.pt"


class StallDetector:
    """Decides whether a run has stopped making progress; knows nothing about processes.

    Progress is a new heartbeat sequence number. The timeout adapts to the run: the larger of
    the floor and ``step_multiplier`` times the slowest step seen in the recent heartbeats
    (the first step of a pass, which includes worker start-up, is not counted by the writer).
    Until the first training batch of the attempt, the startup grace applies (data set scan
    and cache, worker start-up, GPU kernel tuning).
    """

    def __init__(self, config: WatchdogConfig, now: float, window: int = 30):
        self.config = config
        self.last_progress = now
        self.last_seq: int | None = None
        self.trained = False
        self.steps: deque[float] = deque(maxlen=window)

    def observe(self, hb: Heartbeat | None, now: float) -> bool:
        """Feed the latest heartbeat; True when it shows progress."""
        if hb is None or hb.seq == self.last_seq:
            return False
        self.last_seq = hb.seq
        self.last_progress = now
        if hb.batches_total > 0:
            self.trained = True
        if hb.step_max > 0:
            self.steps.append(hb.step_max)
        return True

    def timeout(self) -> float:
        t = max(self.config.stall_timeout, self.config.step_multiplier * max(self.steps, default=0.0))
        if not self.trained:
            t = max(t, self.config.startup_grace)
        return t

    def stalled_for(self, now: float) -> float:
        return now - self.last_progress

    def stalled(self, now: float) -> bool:
        return self.stalled_for(now) > self.timeout()


class ChildProcess:
    """The real training child: ``python -m rocm_yolo._child SPEC.json`` in its own session."""

    def __init__(self, spec: RunSpec, config: WatchdogConfig):
        self.spec = spec
        self.config = config
        spec_path = spec.save()
        env = dict(os.environ)
        env["ROCM_YOLO_SUPERVISOR_PID"] = str(os.getpid())
        self.proc = proctree.start([sys.executable, "-m", "rocm_yolo._child", str(spec_path)], env=env)
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def heartbeat(self) -> Heartbeat | None:
        hb = heartbeat.read(self.spec.state_dir / heartbeat.FILENAME)
        return hb if hb is not None and hb.pid == self.pid else None

    def dump_stacks(self, out: Path) -> Path:
        return proctree.dump_stacks(self.pid, self.spec.state_dir / "stacks", out)

    def kill(self) -> list[int]:
        left = proctree.kill(self.pid, self.config.term_timeout, self.config.kill_timeout)
        try:
            self.proc.wait(timeout=1)
        except Exception:
            pass
        return left


class Supervisor:
    def __init__(self, spec: RunSpec, config: WatchdogConfig, *, child_factory=ChildProcess,
                 clock=time.monotonic, sleep=time.sleep, log: RunLog | None = None, user_resume: bool = False):
        self.spec = spec
        self.config = config
        self.child_factory = child_factory
        self.clock = clock
        self.sleep = sleep
        self.log = log or RunLog(spec.log_path, spec.state_dir / "events.jsonl")
        self.user_resume = user_resume
        self.interrupted: int | None = None
        self.result = RunResult(state="running", exit_code=exitcodes.FAILED, run_dir=spec.run_dir)
        self.started_wall = time.time()
        self._recovering_since: float | None = None
        previous = read_state(spec.run_dir) if user_resume else None
        if previous:  # a resumed run keeps its history of hangs and restarts
            self.result.hangs = list(previous.get("hangs", []))
            self.result.restarts = int(previous.get("restarts", 0))
            self.result.lost_seconds = float(previous.get("lost_seconds", 0.0))

    # signals -------------------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        self.interrupted = signum

    def install_signal_handlers(self) -> dict:
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: the terminal went away
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    # the loop ------------------------------------------------------------------------------
    def run(self) -> RunResult:
        spec = first = self.spec
        restarts_left = self.config.max_restarts if self.config.enabled else 0
        while True:
            if self.interrupted is not None:  # a signal during the previous kill: start nothing new
                return self._interrupted(spec)
            child = self.child_factory(spec, self.config)
            self._write_state("running", spec, child_pid=child.pid)
            try:
                outcome, info = self._watch(child, spec)
            finally:
                left = child.kill()  # the tree goes on every path: done, stalled, crashed, interrupted
                if left:
                    self.log.event("leftover", f"processes still alive after SIGKILL (stuck in the kernel?): {left}",
                                   pids=left)
            if outcome == State.SUCCEEDED:
                self._drop_good_copy(spec)
                return self._finish("finished", exitcodes.OK, spec)
            if outcome == State.INTERRUPTED:
                return self._interrupted(spec)
            if outcome == State.USAGE_ERROR:
                return self._finish("usage_error", exitcodes.USAGE, spec)
            if outcome == State.SETUP_FAILED:
                self.log.info("not restarting: the error came before training started")
                return self._finish("failed", exitcodes.FAILED, spec)
            if outcome == State.ALREADY_FINISHED:
                if self.user_resume and spec is first:
                    return self._finish("usage_error", exitcodes.USAGE, spec)
                self.log.info("the checkpoint shows the run finished all its epochs")
                self._drop_good_copy(spec)
                return self._finish("finished", exitcodes.OK, spec)
            if restarts_left <= 0:
                self.log.event("give_up", f"{info}; no restarts left (--max-restarts {self.config.max_restarts})")
                return self._finish("failed", exitcodes.FAILED, spec)
            restarts_left -= 1
            spec = self._next_spec(spec)
            self.result.restarts += 1
            self.log.event(
                "restart",
                f"restart {self.config.max_restarts - restarts_left}/{self.config.max_restarts} with profile '{spec.profile}'"
                + (f" from {spec.resume}" if spec.resume else " from the start (no checkpoint yet)")
                + f" ({restarts_left} left)",
                attempt=spec.attempt,
                profile=spec.profile,
                resume=spec.resume,
            )

    def _watch(self, child, spec: RunSpec) -> tuple[State, str]:
        detector = StallDetector(self.config, self.clock())
        state = State.STARTING
        while True:
            if self.interrupted is not None:
                return State.INTERRUPTED, ""
            rc = child.poll()
            now = self.clock()
            if rc is not None:
                if rc in EXIT_STATES:
                    return EXIT_STATES[rc], ""
                self.log.event("crash", f"training process exited with code {rc} (attempt {spec.attempt})",
                               code=rc, attempt=spec.attempt)
                return State.CRASHED, f"training process exited with code {rc}"
            hb = child.heartbeat()
            if detector.observe(hb, now):
                if state == State.STARTING and hb.batches_total > 0:
                    state = State.HEALTHY
                    self._note_recovered(now, spec, child.pid)
            if self.config.enabled and detector.stalled(now):
                return State.STALLED, self._on_stall(child, spec, detector, hb, now)
            self.sleep(self.config.poll_interval)

    def _on_stall(self, child, spec: RunSpec, detector: StallDetector, hb: Heartbeat | None, now: float) -> str:
        where = (f"epoch {hb.epoch}/{hb.epochs}, {hb.phase} batch {hb.batch}/{hb.batches}" if hb else "during start-up")
        stalled = detector.stalled_for(now)
        self.log.event("hang", f"no progress for {stalled:.0f} s (timeout {detector.timeout():.0f} s) at {where}: hang",
                       epoch=hb.epoch if hb else None, batch=hb.batch if hb else None, phase=hb.phase if hb else None,
                       seconds=round(stalled, 1), attempt=spec.attempt)
        out = Path(spec.run_dir) / f"hang-{spec.attempt}-stacks.txt"  # attempts count on across resumes
        try:
            path = child.dump_stacks(out)
            self.log.event("stacks", f"stacks of the trainer and its workers written to {path}", path=str(path))
        except Exception as e:  # a dump must never block recovery
            path = None
            self.log.event("stacks", f"could not dump stacks: {e}")
        self.result.hangs.append({"epoch": hb.epoch if hb else None, "batch": hb.batch if hb else None,
                                  "phase": hb.phase if hb else None, "stalled_seconds": round(stalled, 1),
                                  "stacks": str(path) if path else None, "detected": time.time()})
        self.result.lost_seconds += stalled
        self._recovering_since = now
        self.log.event("kill", f"stopping the training process tree (pid {child.pid})", pid=child.pid)
        return f"hang at {where}"

    def _note_recovered(self, now: float, spec: RunSpec, child_pid: int) -> None:
        since = self._recovering_since
        if since is not None:
            self.result.lost_seconds += now - since
            self._recovering_since = None
            self._write_state("running", spec, child_pid=child_pid)

    def _next_spec(self, spec: RunSpec) -> RunSpec:
        profile = next_profile(spec.profile, self.config.ladder)
        resolved = resolve(profile, spec.loader.workers)
        last = spec.weights_dir / "last.pt"
        resume = None
        try:
            path, note = checkpoints.choose_resume(last)
            resume = str(path)
            if note:
                self.log.info(note)
        except UsageError:
            resume = None  # nothing saved yet: start again in the same directory
        train_args = {**spec.train_args, "exist_ok": True}
        val = spec.val if "val" in spec.user_keys else resolved.val
        return spec.with_changes(profile=profile, loader=resolved.loader, val=val, env=resolved.env,
                                 resume=resume, attempt=spec.attempt + 1, train_args=train_args)

    def _drop_good_copy(self, spec: RunSpec) -> None:
        """A finished run cannot be resumed: its verified resume copy only takes disk space.

        If ``last.pt`` was moved aside as damaged, the verified copy becomes ``last.pt`` again.
        """
        last, good = spec.weights_dir / "last.pt", spec.weights_dir / checkpoints.GOOD_NAME
        if not last.exists() and checkpoints.verify(good) is None:
            os.replace(good, last)
        elif checkpoints.verify(last) is None:
            good.unlink(missing_ok=True)

    # results -------------------------------------------------------------------------------
    def _finish(self, state: str, code: int, spec: RunSpec) -> RunResult:
        self.result.state, self.result.exit_code = state, code
        self.result.attempts = spec.attempt
        self.result.wall_seconds = time.time() - self.started_wall
        self._write_state(state, spec)
        return self.result

    def _interrupted(self, spec: RunSpec) -> RunResult:
        code = {signal.SIGINT: exitcodes.INTERRUPTED, signal.SIGHUP: exitcodes.HANGUP}.get(self.interrupted,
                                                                                     exitcodes.TERMINATED)
        name = signal.Signals(self.interrupted).name if self.interrupted else "signal"
        last = spec.weights_dir / "last.pt"
        self.log.event("interrupted", f"stopped by {name}; the training process tree is gone", signal=name)
        if last.exists():
            self.log.info(f"resume with: rocm-yolo train --resume {last}")
        return self._finish("interrupted", code, spec)

    def _write_state(self, state: str, spec: RunSpec, child_pid: int | None = None) -> None:
        record = {
            "state": state,
            "supervisor_pid": os.getpid(),
            "child_pid": child_pid,
            "attempt": spec.attempt,
            "profile": spec.profile,
            "restarts": self.result.restarts,
            "max_restarts": self.config.max_restarts,
            "hangs": self.result.hangs,
            "lost_seconds": round(self.result.lost_seconds, 1),
            "started": self.started_wall,
            "updated": time.time(),
        }
        try:
            spec.state_dir.mkdir(parents=True, exist_ok=True)
            heartbeat.write_atomic(spec.state_dir / "supervisor.json", json.dumps(record))
        except OSError:
            pass


def read_state(run_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(run_dir) / STATE_DIRNAME / "supervisor.json").read_text())
    except (OSError, ValueError):
        return None

