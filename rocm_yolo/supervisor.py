"""The supervisor: run the training child, notice when it stalls or dies, recover.

One monitor loop, one decision per tick: the child is healthy (keep watching), finished
(done), made a user error (give up, exit 2), or stalled/crashed (spend a restart: dump the
stacks, kill the whole tree, resume ``last.pt`` on the next profile of the fallback
ladder). States of an attempt::

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

from rocm_yolo import checkpoints, errors, heartbeat, proctree
from rocm_yolo.errors import UsageError
from rocm_yolo.fsutil import write_atomic
from rocm_yolo.heartbeat import Heartbeat
from rocm_yolo.log import RunLog
from rocm_yolo.paths import RunPaths
from rocm_yolo.profiles import DEFAULT_LADDER, LOADER_KEYS, next_profile, resolve
from rocm_yolo.spec import RunSpec
from rocm_yolo.worklost import WorkLost


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


EXIT_STATES = {
    errors.OK: State.SUCCEEDED,
    errors.USAGE: State.USAGE_ERROR,
    errors.CHILD_FINISHED: State.ALREADY_FINISHED,
    errors.SETUP: State.SETUP_FAILED,
    errors.INTERNAL: State.INTERNAL_ERROR,
}
# How a run that ends in a state exits.
RUN_EXIT = {State.FINISHED: errors.OK, State.FAILED: errors.FAILED, State.USAGE_ERROR: errors.USAGE,
            State.SETUP_FAILED: errors.SETUP, State.INTERNAL_ERROR: errors.INTERNAL}


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
    state: State  # RUNNING until the run ends; then FINISHED, FAILED, USAGE_ERROR, ... (see State)
    exit_code: int
    run_dir: str
    attempts: int = 1
    restarts: int = 0
    hangs: list = field(default_factory=list)
    lost_seconds: float = 0.0  # to hangs: detection + restart + batches trained again
    wall_seconds: float = 0.0
    recoveries: list = field(default_factory=list)  # one record per restart (rocm_yolo.worklost)

    @property
    def last(self) -> Path:
        return RunPaths(self.run_dir).last

    @property
    def best(self) -> Path:
        return RunPaths(self.run_dir).best


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
    """The real training child: ``python -m rocm_yolo._child SPEC.json`` in its own session.

    It dies with the supervisor (``PR_SET_PDEATHSIG``) and sends its heartbeat down a pipe,
    so a disk too full for the heartbeat file is not taken for a hang.
    """

    def __init__(self, spec: RunSpec, config: WatchdogConfig):
        self.spec = spec
        self.config = config
        spec_path = spec.save()  # OSError (disk full, read-only): the caller stops the run
        env = dict(os.environ)
        env[proctree.SUPERVISOR_ENV] = str(os.getpid())
        read_end, write_end = os.pipe()
        env[heartbeat.FD_ENV] = str(write_end)
        try:
            self.proc = proctree.start([sys.executable, "-m", "rocm_yolo._child", str(spec_path)], env=env,
                                       pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self.pid = self.proc.pid
        self.beats = heartbeat.PipeReader(read_end)

    def poll(self) -> int | None:
        return self.proc.poll()

    def heartbeats(self) -> list[Heartbeat]:
        """This child's heartbeats since the last call, oldest first."""
        return [hb for hb in self.beats.read() if hb.pid == self.pid]

    def dump_stacks(self, out: Path) -> Path:
        return proctree.dump_stacks(self.pid, self.spec.paths.stacks, out)

    def kill(self) -> list[int]:
        left = proctree.kill(self.pid, self.config.term_timeout, self.config.kill_timeout)
        try:
            self.proc.wait(timeout=1)
        except Exception:
            pass
        self.beats.close()
        return left


class Supervisor:
    def __init__(self, spec: RunSpec, config: WatchdogConfig, *, child_factory=ChildProcess,
                 clock=time.monotonic, sleep=time.sleep, log: RunLog | None = None, user_resume: bool = False):
        self.spec = spec
        self.config = config
        self.child_factory = child_factory
        self.clock = clock
        self.sleep = sleep
        self.log = log or RunLog(spec.paths.log, spec.paths.events)
        self.user_resume = user_resume
        self.interrupted: int | None = None
        self.result = RunResult(state=State.RUNNING, exit_code=errors.FAILED, run_dir=spec.run_dir)
        self.started_wall = time.time()
        self._recovering_since: float | None = None
        self._failed_at = 0.0  # when the last attempt was found stalled or crashed (clock)
        self._state_error = False
        self.work = WorkLost()
        previous = read_state(spec.run_dir) if user_resume else None
        if previous:  # a resumed run keeps its history of hangs and restarts
            self.result.hangs = list(previous["hangs"])
            self.result.restarts = previous["restarts"]
            self.result.lost_seconds = previous["lost_seconds"]
            self.result.recoveries = [r for r in previous.get("recoveries") or [] if isinstance(r, dict)]

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
            try:
                child = self.child_factory(spec, self.config)
            except OSError as e:  # the spec could not be written (disk full, read-only) or no process
                return self._cannot_start(spec, e)
            self._write_state(State.RUNNING, spec, child_pid=child.pid)
            try:
                outcome, info = self._watch(child, spec)
            finally:
                left = child.kill()  # the tree goes on every path: done, stalled, crashed, interrupted
                if left:
                    self.log.event("leftover", f"processes still alive after SIGKILL (stuck in the kernel?): {left}",
                                   pids=left)
            if outcome in (State.STALLED, State.CRASHED):
                cut = self.work.failed("hang" if outcome == State.STALLED else "crash", self._failed_at,
                                       self.result.hangs[-1]["stalled_seconds"] if outcome == State.STALLED else 0.0)
                self._retrained(cut)
            if outcome == State.SUCCEEDED:
                self._drop_good_copy(spec)
                return self._finish(State.FINISHED, spec)
            if outcome == State.INTERRUPTED:
                return self._interrupted(spec)
            if outcome in (State.USAGE_ERROR, State.INTERNAL_ERROR):
                return self._finish(outcome, spec)
            if outcome == State.SETUP_FAILED:
                self._say_what_is_kept(spec)
                return self._finish(State.SETUP_FAILED, spec)
            if outcome == State.ALREADY_FINISHED:
                if self.user_resume and spec is first:
                    return self._finish(State.USAGE_ERROR, spec)
                self.log.info("the checkpoint shows the run finished all its epochs")
                self._drop_good_copy(spec)
                return self._finish(State.FINISHED, spec)
            if restarts_left <= 0:
                self.log.event("give_up", f"{info}; no restarts left (--max-restarts {self.config.max_restarts})")
                return self._finish(State.FAILED, spec)
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

    def _cannot_start(self, spec: RunSpec, error: OSError) -> RunResult:
        reason = errors.classify(error).line if errors.is_disk_error(error) else errors.one_line(error)
        self.log.event("setup_error", f"environment error: cannot start the training process: {reason}; not retrying",
                       error=reason)
        self._state_error = errors.is_disk_error(error)  # the line above says it: no second one about supervisor.json
        self._say_what_is_kept(spec)
        return self._finish(State.SETUP_FAILED, spec)

    def _say_what_is_kept(self, spec: RunSpec) -> None:
        """After an environment error: which checkpoint a later resume will start from."""
        paths = spec.paths
        kept = next((p for p in (paths.last, paths.last_good) if checkpoints.verify(p) is None), None)
        if kept is not None:
            self.log.info(f"the last loadable checkpoint is {kept}: once that is fixed, continue with "
                          f"rocm-yolo train --resume {paths.last}")

    def _watch(self, child, spec: RunSpec) -> tuple[State, str]:
        detector = StallDetector(self.config, self.clock())
        state = State.STARTING
        hb: Heartbeat | None = None  # the newest heartbeat of this attempt
        while True:
            if self.interrupted is not None:
                return State.INTERRUPTED, ""
            rc = child.poll()
            now = self.clock()
            # every heartbeat, and before acting on an exit: the first trained batch tells where a resume started,
            # and an attempt may train its first batch and finish (or crash) between two polls
            for hb in child.heartbeats():
                if detector.observe(hb, now):
                    self._retrained(self.work.observe(hb))
                    if state == State.STARTING and hb.batches_total > 0:
                        state = State.HEALTHY
                        self._note_recovered(now, spec, child.pid, hb)
            if rc is not None:
                if rc in EXIT_STATES:
                    return EXIT_STATES[rc], ""
                self._failed_at = now
                self.log.event("crash", f"training process exited with code {rc} (attempt {spec.attempt})",
                               code=rc, attempt=spec.attempt)
                return State.CRASHED, f"training process exited with code {rc}"
            if self.config.enabled and detector.stalled(now):
                return State.STALLED, self._on_stall(child, spec, detector, hb, now)
            self.sleep(self.config.poll_interval)

    def _on_stall(self, child, spec: RunSpec, detector: StallDetector, hb: Heartbeat | None, now: float) -> str:
        where = (f"epoch {hb.epoch}/{hb.epochs}, {hb.phase} batch {hb.batch}/{hb.batches}" if hb else "during start-up")
        stalled = detector.stalled_for(now)
        self.log.event("hang", f"no progress for {stalled:.0f} s (timeout {detector.timeout():.0f} s) at {where}: hang",
                       epoch=hb.epoch if hb else None, batch=hb.batch if hb else None, phase=hb.phase if hb else None,
                       seconds=round(stalled, 1), attempt=spec.attempt)
        out = spec.paths.hang_stacks(spec.attempt)  # attempts count on across resumes
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
        self._recovering_since = self._failed_at = now
        self.log.event("kill", f"stopping the training process tree (pid {child.pid})", pid=child.pid)
        return f"hang at {where}"

    def _note_recovered(self, now: float, spec: RunSpec, child_pid: int, hb: Heartbeat) -> None:
        since = self._recovering_since
        if since is not None:
            self.result.lost_seconds += now - since
            self._recovering_since = None
        record = self.work.resumed(hb, spec.attempt, Path(spec.resume).name if spec.resume else None, now)
        if record is not None:
            self.result.recoveries.append(record)
            if record["retrained_batches"] is not None:
                at = record["resumed_at"]
                self.log.event("retraining", f"attempt {spec.attempt} resumed at epoch {at[0]}, batch {at[1]:,}: "
                               f"{record['retrained_batches']:,} batch(es) to train again",
                               attempt=spec.attempt, batches=record["retrained_batches"])
            self._retrained(None if record.get("retrained_batches") and self.work.retraining else record)
        if since is not None or record is not None:
            self._write_state(State.RUNNING, spec, child_pid=child_pid)

    def _retrained(self, record: dict | None) -> None:
        """A restart's retraining is over: a hang's time lost includes it."""
        if record is not None and record.get("cause") == "hang":
            self.result.lost_seconds += record.get("retrain_seconds") or 0.0

    def _next_spec(self, spec: RunSpec) -> RunSpec:
        profile = next_profile(spec.profile, self.config.ladder)
        requested = spec.loader.workers if spec.workers_requested is None else spec.workers_requested
        resolved = resolve(profile, requested)
        resume = None
        try:
            path, note = checkpoints.choose_resume_point(spec.paths.last)
            resume = str(path)
            if note:
                self.log.info(note)
        except UsageError:
            resume = None  # nothing saved yet: start again in the same directory
        train_args = {**spec.train_args, "exist_ok": True}
        if profile == spec.profile:  # the last rung repeats: the same settings, the user's overrides included
            return spec.with_changes(resume=resume, attempt=spec.attempt + 1, train_args=train_args)
        val = spec.val if "val" in spec.user_keys else resolved.val
        # the new profile's own loader settings: the user's loader overrides were for the old one
        user_keys = tuple(k for k in spec.user_keys if k not in LOADER_KEYS)
        return spec.with_changes(profile=profile, loader=resolved.loader, val=val, env=resolved.env,
                                 resume=resume, attempt=spec.attempt + 1, train_args=train_args, user_keys=user_keys)

    def _drop_good_copy(self, spec: RunSpec) -> None:
        """A finished run cannot be resumed: its verified resume copy only takes disk space.

        If ``last.pt`` was moved aside as damaged, the verified copy becomes ``last.pt`` again.
        """
        last, good = spec.paths.last, spec.paths.last_good
        try:
            if not last.exists() and checkpoints.verify(good) is None:
                os.replace(good, last)
            elif checkpoints.verify(last) is None:
                good.unlink(missing_ok=True)
            if checkpoints.verify(last) is None:  # mid-epoch checkpoints of a finished run: nothing to continue
                checkpoints.remove_mid_checkpoints(spec.paths)
        except OSError as e:  # housekeeping only: the weights are there either way
            self.log.info(f"could not tidy {good}: {e.strerror or e}")

    # results -------------------------------------------------------------------------------
    def _finish(self, state: State, spec: RunSpec, code: int | None = None) -> RunResult:
        self.result.state = state
        self.result.exit_code = RUN_EXIT[state] if code is None else code
        self.result.attempts = spec.attempt
        self.result.wall_seconds = time.time() - self.started_wall
        self._write_state(state, spec)
        return self.result

    def _interrupted(self, spec: RunSpec) -> RunResult:
        code = {signal.SIGINT: errors.INTERRUPTED, signal.SIGHUP: errors.HANGUP}.get(self.interrupted,
                                                                                   errors.TERMINATED)
        name = proctree.signal_name(self.interrupted) if self.interrupted else "signal"
        last = spec.paths.last
        self.log.event("interrupted", f"stopped by {name}; the training process tree is gone", signal=name)
        if last.exists() or spec.paths.mid_checkpoints():
            self.log.info(f"resume with: rocm-yolo train --resume {last}")
        return self._finish(State.INTERRUPTED, spec, code)

    def _write_state(self, state: State, spec: RunSpec, child_pid: int | None = None) -> None:
        record = {
            "state": state.value,
            "supervisor_pid": os.getpid(),
            "child_pid": child_pid,
            "attempt": spec.attempt,
            "profile": spec.profile,
            "restarts": self.result.restarts,
            "max_restarts": self.config.max_restarts,
            "hangs": self.result.hangs,
            "lost_seconds": round(self.result.lost_seconds, 1),
            "recoveries": self.result.recoveries,
            "started": self.started_wall,
            "updated": time.time(),
        }
        try:
            spec.paths.state.mkdir(parents=True, exist_ok=True)
            write_atomic(spec.paths.supervisor, json.dumps(record))
        except OSError as e:  # bookkeeping must never stop the supervisor; say it once
            if not self._state_error:
                self._state_error = True
                self.log.info(f"cannot write {spec.paths.supervisor} ({e.strerror or e}); "
                              "'rocm-yolo status' shows the last state written")


# The fields of supervisor.json and the types a reader accepts.
_STATE_TYPES = {"state": str, "supervisor_pid": int, "child_pid": (int, type(None)), "attempt": int, "profile": str,
                "restarts": int, "max_restarts": int, "hangs": list, "lost_seconds": (int, float),
                "started": (int, float), "updated": (int, float)}


def read_state(run_dir: str | os.PathLike) -> dict | None:
    """``supervisor.json`` of ``run_dir``, or None if missing, unreadable or badly typed."""
    try:
        data = json.loads(RunPaths(run_dir).supervisor.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for key, kind in _STATE_TYPES.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    if not all(isinstance(h, dict) for h in data["hangs"]):
        return None
    return data
