"""The supervisor: run the training child, notice when it stalls or dies, recover.

One monitor loop, one decision per tick: the child is healthy (keep watching), finished
(done), made a user error (give up, exit 2), or stalled/crashed (spend a restart: dump the
stacks, kill the whole tree, resume the newest checkpoint on the next profile of the
fallback ladder). The states and their transitions are in :mod:`.states`.

Policy only: the process machinery sits behind the child factory (:class:`.trainer_process.TrainerProcess`, a
:class:`.trainer_process.Child`),
so tests drive this loop with scripted heartbeats and a fake clock; end-to-end tests use the
real thing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

from rocm_yolo import errors, triage
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import (
    Hang,
    Recovery,
    State,
    SupervisorState,
    WatchdogSettings,
    read_state,
    write_state,
)
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.restart import last_loadable, next_spec, resume_command, tidy_finished
from rocm_yolo.supervisor.stall import StallDetector
from rocm_yolo.supervisor.states import EXIT_STATES, RUN_EXIT, RunResult
from rocm_yolo.supervisor.trainer_process import Child, TrainerProcess
from rocm_yolo.supervisor.worklost import WorkLost
from rocm_yolo.ultralytics_rules.checkpoint import summary


def _finished(spec: RunSpec) -> bool:
    """Whether the checkpoint ``spec`` resumes belongs to a run that trained all its epochs (all of a resume's
    ``--epochs N``), read without torch."""
    found = summary(spec.resume)
    return found is not None and found.finished_for(spec.extended_epochs)


class Supervisor:
    def __init__(
        self,
        spec: RunSpec,
        config: WatchdogConfig,
        *,
        child_factory: Callable[[RunSpec, WatchdogConfig], Child] = TrainerProcess,
        clock=time.monotonic,
        sleep=time.sleep,
        log: RunLog | None = None,
        user_resume: bool = False,
    ):
        self.spec = spec
        self.config = config
        self.child_factory = child_factory
        self.clock = clock
        self.sleep = sleep
        self.log = log or RunLog(spec.paths.log, spec.paths.events)
        self.user_resume = user_resume
        self.interrupted: int | None = None
        self.result = RunResult(state=State.RUNNING, exit_code=errors.FAILED, run_dir=spec.run_dir, node=spec.node)
        self.started_wall = time.time()
        self._recovering_since: float | None = None
        self._failed_at = 0.0  # when the last attempt was found stalled or crashed (clock)
        self._state_error = False
        self.work = WorkLost()
        previous = read_state(spec.paths) if user_resume else None
        if previous:  # a resumed run keeps its history of hangs and restarts
            self.result.hangs = list(previous.hangs)
            self.result.restarts = previous.restarts
            self.result.lost_seconds = previous.lost_seconds
            self.result.recoveries = list(previous.recoveries)

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
        spec = self.spec
        restarts_left = self.config.max_restarts if self.config.enabled else 0
        while True:
            if self.interrupted is not None:  # a signal during the previous kill: start nothing new
                return self._interrupted(spec)
            outcome, info = self._attempt(spec)
            ended = self._ended(outcome, spec)
            if ended is not None:
                return ended
            if restarts_left <= 0:
                self.log.event("give_up", f"{info}; no restarts left (--max-restarts {self.config.max_restarts})")
                return self._finish(State.FAILED, spec)
            restarts_left -= 1
            spec = self._restart(spec, restarts_left)
            if spec.resume and _finished(spec):  # e.g. a crash in the end of training's rewrite
                self.log.info("the checkpoint shows the run finished all its epochs")
                tidy_finished(spec, self.log)
                return self._finish(State.FINISHED, spec)

    def _attempt(self, spec: RunSpec) -> tuple[State, str]:
        """Start one child and watch it to its end: (how the attempt ended, what to say if it failed)."""
        try:
            child = self.child_factory(spec, self.config)
        except OSError as e:  # the spec could not be written (disk full, read-only) or no process
            self._cannot_start(e)
            return State.SETUP_FAILED, ""
        self._write_state(State.RUNNING, spec, child_pid=child.pid)
        try:
            outcome, info = self._watch(child, spec)
        finally:
            left = child.kill()  # the tree goes on every path: done, stalled, crashed, interrupted
            if left:
                self.log.event(
                    "leftover", f"processes still alive after SIGKILL (stuck in the kernel?): {left}", pids=left
                )
        if outcome in (State.STALLED, State.CRASHED):
            cut = self.work.failed(
                "hang" if outcome == State.STALLED else "crash",
                self._failed_at,
                self.result.hangs[-1].stalled_seconds if outcome == State.STALLED else 0.0,
            )
            self._retrained(cut)
        return outcome, info

    def _ended(self, outcome: State, spec: RunSpec) -> RunResult | None:
        """The run's result when ``outcome`` ends the run; None when it calls for a restart."""
        if outcome == State.SUCCEEDED:
            tidy_finished(spec, self.log)
            return self._finish(State.FINISHED, spec)
        if outcome == State.INTERRUPTED:
            return self._interrupted(spec)
        if outcome in (State.USAGE_ERROR, State.INTERNAL_ERROR):
            return self._finish(outcome, spec)
        if outcome == State.FAILED:  # more than one machine: a node did not come back (the child's line names it)
            self.result.detail = "a node did not come to the rendezvous"
            return self._finish(State.FAILED, spec)
        if outcome == State.SETUP_FAILED:
            self._say_what_is_kept(spec)
            return self._finish(State.SETUP_FAILED, spec)
        if outcome == State.ALREADY_FINISHED:
            if self.user_resume and spec is self.spec:
                return self._finish(State.USAGE_ERROR, spec)
            self.log.info("the checkpoint shows the run finished all its epochs")
            tidy_finished(spec, self.log)
            return self._finish(State.FINISHED, spec)
        return None

    def _restart(self, spec: RunSpec, restarts_left: int) -> RunSpec:
        spec = next_spec(spec, self.config.ladder, self.log)
        self.result.restarts += 1
        failure = self.work.pending  # what the new attempt recovers from (its child tags the tracker run with it)
        self.log.event(
            "restart",
            f"restart {self.config.max_restarts - restarts_left}/{self.config.max_restarts} "
            f"with profile '{spec.profile}'"
            + (f" from {spec.resume}" if spec.resume else " from the start (no checkpoint yet)")
            + f" ({restarts_left} left)",
            attempt=spec.attempt,
            profile=spec.profile,
            resume=spec.resume,
            cause=failure.cause if failure else None,
            lost_at=failure.lost_at if failure else None,
        )
        return spec

    def _cannot_start(self, error: OSError) -> None:
        reason = triage.classify(error).line if triage.is_disk_error(error) else errors.one_line(error)
        self.log.event(
            "setup_error", f"environment error: cannot start the training process: {reason}; not retrying", error=reason
        )
        self._state_error = triage.is_disk_error(error)  # the line above says it: no second one about supervisor.json

    def _say_what_is_kept(self, spec: RunSpec) -> None:
        """After an environment error: which checkpoint a later resume will start from."""
        kept = last_loadable(spec)
        if kept is not None:
            self.log.info(
                f"the last loadable checkpoint is {kept}: once that is fixed, continue with "
                f"rocm-yolo train --resume {spec.paths.last}"
            )

    def _watch(self, child: Child, spec: RunSpec) -> tuple[State, str]:
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
            for beat in child.heartbeats():
                progress = detector.observe(beat, now)  # any rank's progress is the run's
                if not beat.lead:  # (local) rank 0 speaks for the run: where it is, what a restart trains again
                    continue
                hb = beat
                if progress:
                    self._retrained(self.work.observe(hb))
                    if state == State.STARTING and hb.batches_total > 0:
                        state = State.HEALTHY
                        self._note_recovered(now, spec, child.pid, hb)
            if rc is not None:
                if rc in EXIT_STATES:
                    return EXIT_STATES[rc], ""
                self._failed_at = now
                self.log.event(
                    "crash",
                    f"training process exited with code {rc} (attempt {spec.attempt})",
                    code=rc,
                    attempt=spec.attempt,
                )
                return State.CRASHED, f"training process exited with code {rc}"
            if self.config.enabled and detector.stalled(now):
                return State.STALLED, self._on_stall(child, spec, detector, hb, now)
            self.sleep(self.config.poll_interval)

    def _on_stall(self, child: Child, spec: RunSpec, detector: StallDetector, hb: Heartbeat | None, now: float) -> str:
        where = f"epoch {hb.epoch}/{hb.epochs}, {hb.phase} batch {hb.batch}/{hb.batches}" if hb else "during start-up"
        where += _ranks_heard(child.ranks)
        stalled = detector.stalled_for(now)
        self.log.event(
            "hang",
            f"no progress for {stalled:.0f} s (timeout {detector.timeout():.0f} s) at {where}: hang",
            epoch=hb.epoch if hb else None,
            batch=hb.batch if hb else None,
            phase=hb.phase if hb else None,
            seconds=round(stalled, 1),
            attempt=spec.attempt,
        )
        out = spec.paths.hang_stacks(spec.attempt)  # attempts count on across resumes
        try:
            path = child.dump_stacks(out)
            self.log.event("stacks", f"stacks of the trainer and its workers written to {path}", path=str(path))
        except Exception as e:  # a dump must never block recovery
            path = None
            self.log.event("stacks", f"could not dump stacks: {e}")
        self.result.hangs.append(
            Hang(
                epoch=hb.epoch if hb else None,
                batch=hb.batch if hb else None,
                phase=hb.phase if hb else None,
                stalled_seconds=round(stalled, 1),
                stacks=str(path) if path else None,
                detected=time.time(),
            )
        )
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
            if record.retrained_batches is not None:
                at = record.resumed_at
                self.log.event(
                    "retraining",
                    f"attempt {spec.attempt} resumed at epoch {at[0]}, batch {at[1]:,}: "
                    f"{record.retrained_batches:,} batch(es) to train again",
                    attempt=spec.attempt,
                    batches=record.retrained_batches,
                )
            self._retrained(None if record.retrained_batches and self.work.retraining else record)
        if since is not None or record is not None:
            self._write_state(State.RUNNING, spec, child_pid=child_pid)

    def _retrained(self, record: Recovery | None) -> None:
        """A restart's retraining is over: a hang's time lost includes it."""
        if record is not None and record.cause == "hang":
            self.result.lost_seconds += record.retrain_seconds or 0.0

    # results -------------------------------------------------------------------------------
    def _finish(self, state: State, spec: RunSpec, code: int | None = None) -> RunResult:
        self.result.state = state
        self.result.exit_code = RUN_EXIT[state] if code is None else code
        self.result.attempts = spec.attempt
        self.result.wall_seconds = time.time() - self.started_wall
        self._write_state(state, spec)
        return self.result

    def _interrupted(self, spec: RunSpec) -> RunResult:
        code = {signal.SIGINT: errors.INTERRUPTED, signal.SIGHUP: errors.HANGUP}.get(
            self.interrupted, errors.TERMINATED
        )
        name = signal_name(self.interrupted) if self.interrupted else "signal"
        paths = spec.paths
        self.log.event("interrupted", f"stopped by {name}; the training process tree is gone", signal=name)
        found = summary(paths.last) if paths.last.exists() else None
        if found is not None and found.finished_for(spec.extended_epochs):  # the stop came in the end of training
            return self._stopped_after_training(spec, code)
        if paths.last.exists() or paths.mid_checkpoints():
            self.log.info(f"resume with: {resume_command(spec)}")
        return self._finish(State.INTERRUPTED, spec, code)

    def _stopped_after_training(self, spec: RunSpec, code: int) -> RunResult:
        """A stop during the final validation or the final save: every epoch is trained and the weights are final
        (the final save is atomic), so the run is done; only the final validation did not finish."""
        paths = spec.paths
        tidy_finished(spec, self.log)
        self.result.detail = "the final validation was interrupted"
        best = paths.best if paths.best.exists() else paths.last
        self.log.info(
            f"every epoch was trained and the weights are final ({paths.last}, {paths.best}); the final validation "
            f"was interrupted: validate with yolo val model={best} data={spec.data}"
        )
        return self._finish(State.FINISHED, spec, code)

    def _write_state(self, state: State, spec: RunSpec, child_pid: int | None = None) -> None:
        record = SupervisorState(
            state=state,
            supervisor_pid=os.getpid(),
            child_pid=child_pid,
            attempt=spec.attempt,
            profile=spec.profile,
            restarts=self.result.restarts,
            max_restarts=self.config.max_restarts,
            hangs=self.result.hangs,
            lost_seconds=round(self.result.lost_seconds, 1),
            recoveries=self.result.recoveries,
            detail=self.result.detail,
            started=self.started_wall,
            updated=time.time(),
            watchdog=WatchdogSettings(
                enabled=self.config.enabled,
                stall_timeout=self.config.stall_timeout,
                step_multiplier=self.config.step_multiplier,
                startup_grace=self.config.startup_grace,
            ),
        )
        try:
            write_state(spec.paths, record)
        except OSError as e:  # bookkeeping must never stop the supervisor; say it once
            if not self._state_error:
                self._state_error = True
                self.log.info(
                    f"cannot write {spec.paths.supervisor} ({e.strerror or e}); "
                    "'rocm-yolo status' shows the last state written"
                )


def _ranks_heard(ranks: dict) -> str:
    """On several GPUs, where each rank was last heard: the one that stopped first is the one that hangs."""
    if len(ranks) < 2:
        return ""
    wall = time.time()
    heard = ", ".join(
        f"rank {r} at {hb.phase} batch {hb.batch}/{hb.batches} {max(wall - hb.time, 0):.0f} s ago"
        for r, hb in sorted(ranks.items())
    )
    return f" (last heard: {heard})"
