"""The supervisor: run the training child, notice when it stalls or dies, find out why, act on the cause, tell.

One monitor loop, one decision per tick: the child is healthy (keep watching), finished
(done), made a user error (give up, exit 2), or stalled/crashed: dump the stacks, kill the
whole tree, diagnose the failure from its evidence (:mod:`rocm_yolo.diagnosis`), and
apply the remedy for its class (:mod:`rocm_yolo.diagnosis.remedies`): resume the newest checkpoint on the next
profile of the fallback ladder, on the same profile once the GPU is released, with RCCL's
peer-to-peer off, or stop with a verdict. Each event reaches the terminal, ``events.jsonl``,
the notify command and ``metrics.prom`` (:mod:`.reporting`). The states and their transitions
are in :mod:`.states`.

Policy only: the process machinery sits behind the child factory (:class:`.trainer_process.TrainerProcess`, a
:class:`.trainer_process.Child`),
so tests drive this loop with scripted heartbeats and a fake clock; end-to-end tests use the
real thing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from rocm_yolo import errors, triage
from rocm_yolo.diagnosis import remedies
from rocm_yolo.diagnosis.classes import GPU_CLASSES, LADDER, P2P_OFF
from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.gpu.release import Release, wait_released
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.nodes import SayAlive
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Failure, Recovery, RunState, Still, read_state, write_state
from rocm_yolo.supervisor import restart
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.postmortem import diagnose_end, hang_of
from rocm_yolo.supervisor.recovery import RecoveryTracker
from rocm_yolo.supervisor.reporting import Reporter
from rocm_yolo.supervisor.restart import (
    after_stop,
    environment_error,
    last_loadable,
    next_spec,
    resume_command,
    tidy_finished,
    trained_all,
)
from rocm_yolo.supervisor.signals import Signals
from rocm_yolo.supervisor.stall import Startup
from rocm_yolo.supervisor.states import RUN_EXIT, AttemptState, RunResult
from rocm_yolo.supervisor.trainer_process import Child, TrainerProcess
from rocm_yolo.supervisor.watch import AttemptEnd, Watch

HISTORY = ("hangs", "restarts", "lost_seconds", "recoveries", "failures")  # what a resumed run carries on


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
        stop_self: Callable[[], None] | None = None,  # Ctrl-Z (tests: a fake)
        machine: Machine | None = None,
        gpu_wait: Callable[[list, Machine], Release] | None = None,
    ):
        self.spec = spec
        self.config = config
        self.child_factory = child_factory
        self.clock = clock
        self.sleep = sleep
        self.log = log or RunLog(spec.paths.log, spec.paths.events)
        self.user_resume = user_resume
        self.signals = Signals(stop_self, foreground=lambda: None) if stop_self else Signals()  # a fake: no terminal
        previous = read_state(spec.paths) if user_resume else None  # a resumed run keeps its history
        self.result = RunResult(  # the one record: the loop changes it, supervisor.json holds it, the caller gets it
            run_dir=spec.run_dir,
            node=spec.node,
            supervisor_pid=os.getpid(),
            attempt=spec.attempt,
            profile=spec.profile,
            max_restarts=config.max_restarts,
            started=time.time(),
            watchdog=config.settings(),
            **({k: getattr(previous, k) for k in HISTORY} if previous else {}),
        )
        self.own_failures = len(self.result.failures)  # this run's failures follow a resumed run's earlier ones
        self._recovering_since: float | None = None
        self._state_error = False
        self.work = RecoveryTracker()
        self.reporter = Reporter(spec.paths, config, self.log, clock)
        self.machine = machine  # read before the first attempt: the VRAM in use without this run
        self.gpu_wait = gpu_wait or self._wait_released
        self.decision: remedies.Decision | None = None  # what to do about the newest failure
        self.remedy_env: dict = {}  # variables a remedy gave the attempts after it (NCCL_P2P_DISABLE=1)
        self._failed_pids: list[int] = []
        self.startup = Startup()  # the run's own start-up, measured: a restart's allowance
        self.hb: Heartbeat | None = None  # the newest heartbeat heard when an attempt ended: where the run is
        self.gone: set[int] = set()  # several machines: the other nodes known gone (no failure of theirs twice)

    @property
    def failures(self) -> list[Failure]:
        """This run's failures, diagnosed (a resumed run's earlier ones are history: no remedy counts them)."""
        return self.result.failures[self.own_failures :]

    # signals -------------------------------------------------------------------------------
    @property
    def interrupted(self) -> int | None:
        return self.signals.interrupted

    def install_signal_handlers(self) -> dict:
        """Stop signals stop the run, Ctrl-Z stops the tree with the supervisor (:mod:`.signals`)."""
        return self.signals.install()

    # the loop ------------------------------------------------------------------------------
    def run(self) -> RunResult:
        alive = SayAlive(self.spec.paths).start() if self.spec.nodes is not None else None  # the other nodes see it
        try:
            return self._run()
        finally:
            if alive is not None:
                alive.stop()
            self.reporter.close()  # the last event gets a few seconds; no notify command outlives the run

    def _run(self) -> RunResult:
        spec = self.spec
        restarts_left = self.config.max_restarts if self.config.enabled else 0
        if self.machine is None:
            self.machine = Machine.read()
        while True:
            if self.interrupted is not None:  # a signal during the previous kill: start nothing new
                return self._interrupted(spec)
            outcome, info = self._attempt(spec)
            if outcome == AttemptState.REGROUP:  # several machines: the nodes meet again in a later round
                spec = restart.next_round(spec, self.log)
                continue
            stopped = restart.other_node_stopped(spec, outcome, self.log)  # several machines: a node stopped for good
            if stopped is not None:
                self.result.detail = stopped.describe(spec.nodes.count)
                return self._finish(RunState.FAILED, spec, stopped.exit_code)
            ended = self._ended(outcome, spec)
            if ended is not None:
                return ended
            if self.decision is not None and self.decision.stops:
                return self._stop(spec)
            if restarts_left <= 0:
                self.log.event("give_up", f"{info}; no restarts left (--max-restarts {self.config.max_restarts})")
                return self._finish(RunState.FAILED, spec)
            restarts_left -= 1
            spec = self._restart(spec, restarts_left)
            if spec.resume and trained_all(spec, spec.resume):  # e.g. a crash in the end of training's rewrite
                self.log.info("the checkpoint shows the run finished all its epochs")
                self.result.detail = tidy_finished(spec, self.log, cut_short=True)  # what of its end did not happen
                return self._finish(RunState.FINISHED, spec)

    def _attempt(self, spec: RunSpec) -> tuple[AttemptState, str]:
        """Start one child and watch it to its end: (how the attempt ended, what to say if it failed)."""
        began = time.time()  # the kernel log's lines from here on are this attempt's
        try:
            child = self.child_factory(spec, self.config)
        except OSError as e:  # the spec could not be written (disk full, read-only) or no process
            self._cannot_start(e)
            return AttemptState.SETUP_FAILED, ""
        self._write_state(RunState.RUNNING, spec, child_pid=child.pid)
        if spec is self.spec:
            self.reporter.event("started", None, attempt=spec.attempt, profile=spec.profile, say=False, pid=child.pid)
        pids: list[int] = []
        try:
            end = self._watch(child, spec)
            self._heard(end.hb)
            if end.state in (AttemptState.STALLED, AttemptState.CRASHED):
                pids = child.pids()  # before the kill: the KFD lists them until the GPU lets them go
            if end.state == AttemptState.STALLED:
                self._hung(end, child)
        finally:
            left = child.kill()  # the tree goes on every path: done, stalled, crashed, interrupted
            if left:
                self.log.event(
                    "leftover", f"processes still alive after SIGKILL (stuck in the kernel?): {left}", pids=left
                )
            restart.remove_cut_writes(spec, self.log)  # no file of a checkpoint write the end of the tree cut short
            restart.remove_leftovers(spec)  # the dead processes' stack files, a killed trainer's /tmp/pymp-*
        if end.state in (AttemptState.STALLED, AttemptState.CRASHED) and self._nodes_lost(spec):
            return AttemptState.REGROUP, end.info  # another node is gone: no failure of this node's to diagnose
        if end.state in (AttemptState.STALLED, AttemptState.CRASHED):
            failure = self._diagnose(child, spec, end, pids, began)
            cause = "hang" if end.state == AttemptState.STALLED else "crash"
            cut = self.work.failed(cause, end.at, end.stalled, failure.cls)
            self._retrained(cut)
        return end.state, end.info

    def _nodes_lost(self, spec: RunSpec) -> bool:
        """Several machines: another node is gone since the last failure (its supervisor stopped answering)."""
        return bool(restart.nodes_lost(spec, self.clock, self.sleep, self.log, self.gone))

    def _ended(self, outcome: AttemptState, spec: RunSpec) -> RunResult | None:
        """The run's result when ``outcome`` ends the run; None when it calls for a restart."""
        if outcome == AttemptState.SUCCEEDED:
            tidy_finished(spec, self.log)
            return self._finish(RunState.FINISHED, spec)
        if outcome == AttemptState.INTERRUPTED:
            return self._interrupted(spec)
        if outcome in (AttemptState.USAGE_ERROR, AttemptState.INTERNAL_ERROR):
            return self._finish(outcome.run_end, spec)
        if outcome == AttemptState.FAILED:  # several machines: a node did not come back (the child's line names it)
            self.result.detail = "a node did not come to the rendezvous"
            return self._finish(RunState.FAILED, spec)
        if outcome == AttemptState.SETUP_FAILED:
            self._say_what_is_kept(spec)
            self.result.detail = environment_error(spec)  # status says why (a full disk mid-training, say)
            return self._finish(RunState.SETUP_FAILED, spec)
        if outcome == AttemptState.ALREADY_FINISHED:
            if self.user_resume and spec is self.spec:
                return self._finish(RunState.USAGE_ERROR, spec)
            self.log.info("the checkpoint shows the run finished all its epochs")
            tidy_finished(spec, self.log)
            return self._finish(RunState.FINISHED, spec)
        return None

    def _restart(self, spec: RunSpec, restarts_left: int) -> RunSpec:
        action = self.decision.action if self.decision is not None else LADDER
        failure = self.failures[-1] if self.failures else None
        if failure is not None and (failure.cls in GPU_CLASSES or action == P2P_OFF):
            self._wait_for_gpu()  # the GPUs of a hung attempt are busy until the driver lets it go
        self.remedy_env.update(self.decision.env if self.decision is not None else {})
        spec = next_spec(spec, self.config.ladder if action == LADDER else (spec.profile,), self.log)
        if self.remedy_env:
            spec = spec.with_changes(env={**spec.env, **self.remedy_env})
        self.result.restarts += 1
        pending = self.work.pending  # what the new attempt recovers from (its child tags the tracker run with it)
        how = f"with profile '{spec.profile}'"
        if action != LADDER and failure is not None:
            how = f"on the same profile '{spec.profile}' ({failure.cls}: the loader is not the cause)"
        if action == P2P_OFF:
            how = f"on the same profile '{spec.profile}' {self.decision.reason}"
        elif action == LADDER and self.decision is not None and self.decision.reason:
            how += f" ({self.decision.reason})"  # host memory: what takes it
        self.reporter.event(
            "restart",
            f"restart {self.config.max_restarts - restarts_left}/{self.config.max_restarts} {how}"
            + (f" from {spec.resume}" if spec.resume else " from the start (no checkpoint yet)")
            + f" ({restarts_left} left)",
            attempt=spec.attempt,
            profile=spec.profile,
            cls=failure.cls if failure else None,
            **self._where(failure),  # where the failed attempt was last heard
            resume=spec.resume,
            remedy=action,
            cause=pending.cause if pending else None,
            lost_at=pending.lost_at if pending else None,
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
                f"the last loadable checkpoint is {kept}: once that is fixed, continue with {resume_command(spec)}"
            )

    def _watch(self, child: Child, spec: RunSpec) -> AttemptEnd:
        def progress(hb: Heartbeat, now: float, first: bool) -> None:
            self._retrained(self.work.observe(hb))
            if first:
                self._note_recovered(now, spec, child.pid, hb)

        def still(pids: list[int], since: float | None, stopped: bool) -> None:  # status says it
            self.result.still = Still(since, stopped, pids or None) if since is not None else None
            self._write_state(RunState.RUNNING, spec, child_pid=child.pid)

        return Watch(
            child,
            spec,
            self.config,
            clock=self.clock,
            sleep=self.sleep,
            signals=self.signals,
            log=self.log,
            tick=self.reporter.tick,
            startup=self.startup,
            on_progress=progress,
            on_still=still,
        ).run()

    def _heard(self, hb: Heartbeat | None) -> None:
        """Where an attempt ended: the run's events and metrics say it (the watch's last tick may be older)."""
        if hb is not None:
            self.hb = self.reporter.hb = hb

    def _where(self, failure: Failure | None = None) -> dict:
        """Where the run was last heard, for an event: the failure's place, else the newest heartbeat's (none before
        the first epoch)."""
        if failure is not None:
            return {"epoch": failure.epoch, "batch": failure.batch, "phase": failure.phase}
        hb = self.hb
        return {"epoch": hb.epoch, "batch": hb.batch, "phase": hb.phase} if hb is not None and hb.epoch > 0 else {}

    def _hung(self, end: AttemptEnd, child: Child) -> None:
        """A hang, noticed and its stacks written: record it, say the tree goes."""
        self.result.hangs.append(hang_of(end))
        self.result.lost_seconds += end.stalled
        self._recovering_since = end.at
        self.log.event("kill", f"stopping the training process tree (pid {child.pid})", pid=child.pid)

    # the cause, and its remedy --------------------------------------------------------------
    def _diagnose(self, child: Child, spec: RunSpec, end: AttemptEnd, pids: list[int], began: float) -> Failure:
        """What the failure was (:mod:`.postmortem`), and what to do about it (``self.decision``); recorded and said."""
        hang = end.state == AttemptState.STALLED
        self._failed_pids = sorted(set(pids) | {child.pid})
        found = diagnose_end(
            spec,
            end,
            pids=set(self._failed_pids),
            began=began,
            ended=time.time(),
            machine=self.machine,
            kernel_log=self.config.kernel_log,
            earlier=self.failures,
        )
        failure, diagnosis = found.failure, found.diagnosis
        details = f"; details in {found.report}" if found.report else ""
        self.decision = found.decision
        self.result.failures.append(failure)
        if hang and self.result.hangs:
            self.result.hangs[-1].cls, self.result.hangs[-1].signature = diagnosis.cls, diagnosis.signature
        self.reporter.event(
            failure.kind,
            f"{diagnosis.title} at {found.where} (attempt {spec.attempt}){details}",
            attempt=spec.attempt,
            profile=spec.profile,
            detected=failure.detected,  # its "time" is when it is said: events.jsonl stays in time order
            epoch=failure.epoch,
            batch=failure.batch,
            cls=diagnosis.cls,
            exit_code=end.exit_code,
            phase=failure.phase,
            seconds=end.stalled if hang else None,
            code=end.exit_code,
            signature=diagnosis.signature,
            weak=diagnosis.weak,
        )
        return failure

    def _wait_for_gpu(self) -> None:
        """After a GPU fault, a GPU hang or a hung collective: restart only once the GPU let the killed attempt go
        (bounded)."""
        found = self.gpu_wait(self._failed_pids, self.machine)
        said = found.describe() if found.checked else None  # no KFD here (no AMD GPU): nothing to say
        self.log.event("gpu_release", said, released=found.released, seconds=found.seconds, checked=found.checked)

    def _wait_released(self, pids: list, machine: Machine) -> Release:
        def sleep(dt: float) -> None:
            self.reporter.tick(None)
            self.sleep(dt)

        return wait_released(
            pids,
            machine.gpus,
            machine.vram_before,
            self.config.gpu_release_timeout,
            clock=self.clock,
            sleep=sleep,
            cancelled=lambda: self.interrupted is not None,
        )

    def _stop(self, spec: RunSpec) -> RunResult:
        """The remedy is to stop: why, the known fixes, and what a later resume starts from."""
        decision = self.decision
        self.log.event("verdict", decision.reason, exit_code=decision.exit_code, verdict=list(decision.verdict))
        for line in decision.verdict:
            self.log.info(line)
        self.result.verdict = [decision.reason, *decision.verdict]
        self._say_what_is_kept(spec)
        return self._finish(RunState.FAILED, spec, decision.exit_code)

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
            self._write_state(RunState.RUNNING, spec, child_pid=child_pid)

    def _retrained(self, record: Recovery | None) -> None:
        """A restart's retraining is over: a hang's time lost includes it."""
        if record is not None and record.cause == "hang":
            self.result.lost_seconds += record.retrain_seconds or 0.0

    # results -------------------------------------------------------------------------------
    def _finish(self, state: RunState, spec: RunSpec, code: int | None = None) -> RunResult:
        self.result.state = state
        self.result.exit_code = RUN_EXIT[state] if code is None else code
        self.result.wall_seconds = time.time() - self.result.started
        self.result.suspended_seconds = self.signals.suspended_seconds
        restart.tell_other_nodes(spec, self.result, self.log)  # several machines: a node that stops for good says so
        self._write_state(state, spec)
        kind = {RunState.FINISHED: "finished", RunState.INTERRUPTED: "stopped"}.get(state, "failed")
        last = self.failures[-1] if self.failures and kind == "failed" else None
        reason = self.result.verdict[0] if self.result.verdict else None
        self.reporter.event(
            kind,
            reason or (last.title if last else None),
            attempt=spec.attempt,
            profile=spec.profile,
            say=False,
            exit_code=self.result.exit_code,
            cls=last.cls if last else None,
            **self._where(last),
        )
        return self.result

    def _interrupted(self, spec: RunSpec) -> RunResult:
        code, name = self.signals.exit_code(), self.signals.name()
        self.log.event("interrupted", f"stopped by {name}; the training process tree is gone", signal=name)
        done = after_stop(spec, self.log)  # a stop in the end of training: the run is done
        if done is not None:
            self.result.detail = done
            return self._finish(RunState.FINISHED, spec, code)
        return self._finish(RunState.INTERRUPTED, spec, code)

    def _write_state(self, state: RunState, spec: RunSpec, child_pid: int | None = None) -> None:
        record = self.result
        record.state, record.child_pid, record.attempt, record.profile = state, child_pid, spec.attempt, spec.profile
        record.updated = time.time()
        try:
            write_state(spec.paths, record)
        except OSError as e:  # bookkeeping must never stop the supervisor; say it once
            if not self._state_error:
                self._state_error = True
                self.log.info(
                    f"cannot write {spec.paths.supervisor} ({e.strerror or e}); "
                    "'rocm-yolo status' shows the last state written"
                )
