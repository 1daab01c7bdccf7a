"""The supervisor: run the training child, notice when it stalls or dies, find out why, act on the cause, tell.

One monitor loop, one decision per tick: the child is healthy (keep watching), finished
(done), made a user error (give up, exit 2), or stalled/crashed: dump the stacks, kill the
whole tree, diagnose the failure from its evidence (:mod:`rocm_yolo.diagnosis`), and
apply the remedy for its class (:mod:`rocm_yolo.diagnosis.remedies`): resume the newest checkpoint on the next
profile of the fallback ladder, on the same profile once the GPU is released, with RCCL's
peer-to-peer off, or stop with a verdict. Each event reaches the terminal, ``events.jsonl``,
the notify command and ``metrics.prom`` (:mod:`.reporting`). The states and their transitions
are in :mod:`.states`; what the loop asks of its neighbours: one attempt watched (:mod:`.watch`), a failure
diagnosed, recorded and said (:mod:`.postmortem`), the next attempt's spec (:mod:`.restart`), the time hangs cost
(:mod:`.recovery`), and on several machines the other nodes (:mod:`.peers`).

Policy only: the process machinery sits behind the child factory (:class:`.trainer_process.TrainerProcess`, a
:class:`.trainer_process.Child`),
so tests drive this loop with scripted heartbeats and a fake clock; end-to-end tests use the
real thing.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from rocm_yolo import errors, triage
from rocm_yolo.diagnosis import remedies
from rocm_yolo.diagnosis.classes import COLLECTIVE, GPU_CLASSES, LADDER, P2P_OFF
from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.gpu.release import Release, wait_released
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Failure, RunState, Still, read_state, write_state
from rocm_yolo.supervisor import peers, restart
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.postmortem import diagnose_end, hang_of
from rocm_yolo.supervisor.recovery import Recoveries
from rocm_yolo.supervisor.reporting import Reporter, where
from rocm_yolo.supervisor.restart import (
    after_stop,
    environment_error,
    next_spec,
    restart_line,
    say_what_is_kept,
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
        self._state_error = False
        self.recoveries = Recoveries(self.result)  # the time hangs cost, and each recovery
        self.reporter = Reporter(spec.paths, config, self.log, clock)
        self.machine = machine  # read before the first attempt: the VRAM in use without this run
        self.gpu_wait = gpu_wait or self._wait_released
        self.decision: remedies.Decision | None = None  # what to do about the newest failure
        self.remedy_env: dict = {}  # variables a remedy gave the attempts after it (NCCL_P2P_DISABLE=1)
        self._failed_pids: list[int] = []
        self.startup = Startup()  # the run's own start-up, measured: a restart's allowance
        self.hb: Heartbeat | None = None  # the newest heartbeat heard when an attempt ended: where the run is
        self.peers = peers.Peers(spec, clock, sleep)  # several machines: the other nodes (none on one)

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
        self.peers.start()  # several machines: the other nodes see this one alive
        try:
            return self._run()
        finally:
            self.peers.stop()
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
                spec = peers.next_round(spec, self.log)
                continue
            stopped = peers.other_node_stopped(spec, outcome, self.log)  # several machines: a node stopped for good
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
        if end.state in (AttemptState.STALLED, AttemptState.CRASHED) and self.peers.lost(spec, self.log):
            return AttemptState.REGROUP, end.info  # another node is gone: no failure of this node's to diagnose
        if end.state in (AttemptState.STALLED, AttemptState.CRASHED):
            failure = self._diagnose(child, spec, end, pids, began)
            if failure is None:  # several machines: another node restarted first, and this one follows it
                return AttemptState.REGROUP, end.info
            cause = "hang" if end.state == AttemptState.STALLED else "crash"
            self.recoveries.failed(cause, end.at, end.stalled, failure.cls)
        return end.state, end.info

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
            say_what_is_kept(spec, self.log)
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
        pending = self.recoveries.pending  # what the new attempt recovers from (its child tags the tracker run with it)
        line = restart_line(spec, action, self.decision, failure, self.config.max_restarts, restarts_left)
        self.reporter.event(
            "restart",
            line,
            attempt=spec.attempt,
            profile=spec.profile,
            cls=failure.cls if failure else None,
            **where(failure, self.hb),  # where the failed attempt was last heard
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

    def _watch(self, child: Child, spec: RunSpec) -> AttemptEnd:
        def progress(hb: Heartbeat, now: float, first: bool) -> None:
            self.recoveries.progress(hb)
            if first and self.recoveries.resumed(now, spec, hb, self.log):
                self._write_state(RunState.RUNNING, spec, child_pid=child.pid)

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

    def _hung(self, end: AttemptEnd, child: Child) -> None:
        """A hang, noticed and its stacks written: record it, say the tree goes."""
        self.result.hangs.append(hang_of(end))
        self.recoveries.hung(end.stalled, end.at)
        self.log.event("kill", f"stopping the training process tree (pid {child.pid})", pid=child.pid)

    # the cause, and its remedy --------------------------------------------------------------
    def _diagnose(self, child: Child, spec: RunSpec, end: AttemptEnd, pids: list[int], began: float) -> Failure | None:
        """What the failure was (:mod:`.postmortem`), and what to do about it (``self.decision``); recorded and said.
        None: on several machines, a collective failure of this node's ranks whose cause another node restarted for
        first (this node follows it, :func:`.peers.follows_another`)."""
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
        if found.diagnosis.cls == COLLECTIVE and self.peers.follows(spec, self.log):
            return None
        self.decision = found.decision
        found.record(self.result)
        found.say(self.reporter, spec, end)
        return found.failure

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
        say_what_is_kept(spec, self.log)
        return self._finish(RunState.FAILED, spec, decision.exit_code)

    # results -------------------------------------------------------------------------------
    def _finish(self, state: RunState, spec: RunSpec, code: int | None = None) -> RunResult:
        self.result.state = state
        self.result.exit_code = RUN_EXIT[state] if code is None else code
        self.result.wall_seconds = time.time() - self.result.started
        self.result.suspended_seconds = self.signals.suspended_seconds
        peers.tell_other_nodes(spec, self.result, self.log)  # several machines: a node that stops for good says so
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
            **where(last, self.hb),
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
