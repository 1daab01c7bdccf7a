"""One attempt, watched to its end: :class:`Watch` polls the child, reads its heartbeats and its ranks' exit lines,
and returns how the attempt ended (:class:`AttemptEnd`), as torch elastic's ``_monitor_workers`` returns a
``RunResult``. It decides nothing about the run: the loop (:mod:`.loop`) acts on the end. On a stall it writes
the stacks first, while the tree is still there.

Start-up is watched as the steps the trainer reports (:data:`rocm_yolo.run.heartbeat.STEPS`): what is slow before
training gets its allowance (the startup grace, or a restart's measured on the run's own first start-up,
:class:`.stall.Startup`), while a loader iterated for its first batch is waited for as any other batch. The
allowance is for a start-up that moves: until the first trained batch, the attempt's processes' state, CPU time
and I/O bytes are read every :data:`MOVEMENT_EVERY` seconds, as the heartbeat is
(:meth:`.trainer_process.Child.movement`), and one that has not moved for the stall timeout, or was stopped from
outside, is a hang.

What the failure's report needs of the machine at the attempt's ends is read here too, while the tree is there:
the run's memory cgroup (its OOM kills and limit, :mod:`rocm_yolo.process.cgroup`) at the start and the end, and
on a hang the kernel's view of each thread (:meth:`.trainer_process.Child.threads`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rocm_yolo.process import cgroup
from rocm_yolo.process.cgroup import CgroupMemory
from rocm_yolo.process.kernel_view import ThreadView
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.heartbeat import STEPS, Heartbeat
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.signals import Signals
from rocm_yolo.supervisor.stall import FINISHED, StallDetector, Startup, ending_note, lingering, ranks_heard
from rocm_yolo.supervisor.states import EXIT_STATES, AttemptState
from rocm_yolo.supervisor.trainer_process import Child

MOVEMENT_EVERY = 1.0  # seconds between two readings of a start-up's processes
STILL_TOLD = 5.0  # a start-up that has not moved this long is said in supervisor.json (for status)


@dataclass
class AttemptEnd:
    """How one attempt ended, as its watch saw it."""

    state: AttemptState  # SUCCEEDED, CRASHED, STALLED, INTERRUPTED, or what the child's exit code says (EXIT_STATES)
    info: str = ""  # what to say of a failure: "hang at epoch 2/3, train batch 1/4"
    hb: Heartbeat | None = None  # the lead rank's newest heartbeat: where the attempt was last heard
    exit_code: int | None = None  # a crash's
    stderr: tuple[str, str] = ("", "")  # the child's stderr before and since its last progress
    detected: float = 0.0  # wall clock of the failure's notice
    at: float = 0.0  # the loop's clock then
    stalled: float = 0.0  # a hang: seconds without progress
    stacks: Path | None = None  # a hang: where its stacks went
    cgroup: tuple[CgroupMemory, CgroupMemory] | None = None  # a failure: the run's cgroup at the start and the end
    threads: tuple[ThreadView, ...] = ()  # a hang: the kernel's view of each thread of the tree


def where(hb: Heartbeat | None) -> str:
    """Where the run was last heard: ``epoch 2/3, batch 3/16`` (``validation batch``), or before its first trained
    batch ``start-up (waiting for the first batch from the train loader)``."""
    if hb is None or hb.epoch <= 0 or (hb.batches_total == 0 and hb.startup):
        return f"start-up ({STEPS.get(hb.startup if hb else '', 'starting')})"
    what = "batch" if hb.phase == "train" else ("validation batch" if hb.phase == "val" else f"{hb.phase} batch")
    return f"epoch {hb.epoch}/{hb.epochs}, {what} {hb.batch}/{hb.batches}"


class Watch:
    """Watches ``child`` until its attempt ends. ``on_progress(hb, now, first)`` hears each heartbeat of the lead
    rank that shows progress (``first``: its first trained batch of the attempt); ``on_still(pids, since, stopped)``
    hears when the start-up's processes stop moving (since ``since``, wall clock; ``stopped``: stopped from outside)
    and move again (``since`` None)."""

    def __init__(
        self,
        child: Child,
        spec: RunSpec,
        config: WatchdogConfig,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        signals: Signals,
        log: RunLog,
        tick: Callable[[Heartbeat | None], None],
        startup: Startup,
        on_progress: Callable[[Heartbeat, float, bool], None],
        on_still: Callable[[list[int], float | None, bool], None] | None = None,
    ):
        self.child, self.spec, self.config = child, spec, config
        self.clock, self.sleep, self.signals, self.log, self.tick = clock, sleep, signals, log, tick
        self.startup, self.on_progress, self.on_still = startup, on_progress, on_still
        self.began = clock()
        self.cgroup = cgroup.read(config.proc_root, config.cgroup_root)  # its OOM kills before this attempt
        self.read_at = -MOVEMENT_EVERY
        self.told: tuple | None = None  # what on_still heard last
        # the run's own first start-up gives a restart its allowance (more than one machine: the grace holds,
        # a restart's rendezvous waits for the other nodes)
        allowance = None if spec.nodes is not None else startup.allowance(config)
        self.detector = StallDetector(config, self.began, startup=allowance)
        self.hb: Heartbeat | None = None
        self.mark: int | None = None  # where the child's stderr stood at its last progress
        self.training = False
        self.waiting = False  # the tree waits for its terminal (said once)

    def run(self) -> AttemptEnd:
        self.signals.child = self.child  # SIGTTOU stops the tree with the supervisor, at once
        try:
            return self._run()
        finally:
            self.signals.child = None
            self._tell_still(None)  # the attempt is over: status has no start-up to tell of

    def _run(self) -> AttemptEnd:
        child, detector = self.child, self.detector
        while True:
            self.signals.settle(detector, self.log)
            if self.signals.interrupted is not None:
                return AttemptEnd(AttemptState.INTERRUPTED, hb=self.hb)
            if self.signals.suspend_requested:
                self.signals.suspend(child, detector, self.log, self.clock)
                continue  # a stop that came while stopped ends the attempt before anything else
            rc = child.poll()
            now = self.clock()
            # every heartbeat, and before acting on an exit: the first trained batch tells where a resume started,
            # and an attempt may train its first batch and finish (or crash) between two polls
            for beat in child.heartbeats():
                self._heard(beat, now)
            detector.observe_exits(child.exits, child.rank_count, now)  # the ranks said they end: their tree goes
            self._movement(now)
            if rc is not None:
                return self._exited(rc, now)
            if self.config.enabled and detector.stalled(now):
                if detector.ending == FINISHED:  # what is left is no training: the run is done
                    self.log.info(lingering(detector.stalled_for(now)))
                    return AttemptEnd(AttemptState.SUCCEEDED, hb=self.hb)
                if self._waits_for_terminal(now):
                    continue
                return self._stalled(now)
            self.tick(self.hb)
            self.sleep(self.config.poll_interval)

    def _movement(self, now: float) -> None:
        """Until the first trained batch, the attempt's processes' counters, every :data:`MOVEMENT_EVERY` seconds (on
        one machine: on several, a rendezvous waits for the other nodes without moving); a start-up that stops
        moving for a while (or whose processes were stopped from outside) is told, for ``status``."""
        if self.training or self.spec.nodes is not None or now - self.read_at < MOVEMENT_EVERY:
            return
        self.read_at = now
        detector = self.detector
        detector.observe_movement(self.child.movement(), now)
        if detector.stopped:
            self._tell_still((sorted(detector.stopped), True), now - detector.stopped_at)
        elif detector.still_for(now) >= STILL_TOLD:
            self._tell_still(([], False), detector.still_for(now))
        else:
            self._tell_still(None)

    def _tell_still(self, told: tuple | None, seconds: float = 0.0) -> None:
        """``on_still`` hears a change: processes stopped from outside, a start-up still for :data:`STILL_TOLD`
        seconds or more, or neither any more (``told`` None)."""
        if told != self.told and self.on_still is not None:
            pids, stopped = told or ([], False)
            self.on_still(pids, None if told is None else time.time() - seconds, stopped)
        self.told = told

    def _waits_for_terminal(self, now: float) -> bool:
        """A tree that waits for its terminal to take its output (Ctrl-S, a paused pager) is not hung: its time
        waiting is no time without progress. Said once per wait."""
        blocked = self.child.blocked_on_terminal()
        if blocked and not self.waiting:
            self.log.event(
                "terminal_paused",
                f"the training process waits for its terminal to take its output (pid {blocked}; Ctrl-S? Ctrl-Q "
                "resumes): not a hang",
                pid=blocked,
            )
        self.waiting = bool(blocked)
        if blocked:
            self.detector.pause(self.detector.stalled_for(now))
            self.sleep(self.config.poll_interval)
        return bool(blocked)

    def _heard(self, beat: Heartbeat, now: float) -> None:
        progress = self.detector.observe(beat, now)  # any rank's progress is the run's
        if progress:  # what the child wrote before this heartbeat is no longer its failure's own
            self.mark = self.child.stderr_mark(beat.time)
            self.startup.observe(beat, now - self.began)
        if not beat.lead:  # (local) rank 0 speaks for the run: where it is, what a restart trains again
            return
        self.hb = beat
        if progress:
            first = not self.training and beat.batches_total > 0
            self.training = self.training or first
            if first:
                self._tell_still(None)  # training: its heartbeats say it moves
            self.on_progress(beat, now, first)

    def _ends(self) -> tuple[CgroupMemory, CgroupMemory]:
        """The run's cgroup at this attempt's start and now (its OOM kills in between)."""
        return self.cgroup, cgroup.read(self.config.proc_root, self.config.cgroup_root)

    def _exited(self, rc: int, now: float) -> AttemptEnd:
        if rc in EXIT_STATES:
            return AttemptEnd(EXIT_STATES[rc], hb=self.hb, exit_code=rc)
        how = f"code {rc}" + (f" ({signal_name(-rc)})" if rc < 0 else "")
        stderr = self.child.stderr_tail(self.mark)
        self.log.info(f"training process exited with {how} (attempt {self.spec.attempt})")
        return AttemptEnd(
            AttemptState.CRASHED,
            f"training process exited with code {rc}",
            hb=self.hb,
            exit_code=rc,
            stderr=stderr,
            detected=time.time(),
            at=now,
            cgroup=self._ends(),
        )

    def _stalled(self, now: float) -> AttemptEnd:
        child, spec, detector, hb = self.child, self.spec, self.detector, self.hb
        at = where(hb) + ranks_heard(child.ranks) + ending_note(detector, child.exits)
        stalled = detector.stalled_for(now)
        detected = time.time()
        if detector.still(now) and stalled <= detector.timeout():  # a start-up that does not move
            self.log.info(f"no progress for {stalled:.0f} s at {at}; {detector.why_still(now)}: hang")
        else:
            self.log.info(f"no progress for {stalled:.0f} s (timeout {detector.timeout():.0f} s) at {at}: hang")
        threads = child.threads()  # where each thread waits, before the stack dump's signals and the kill
        out = spec.paths.hang_stacks(spec.attempt)  # attempts count on across resumes
        try:
            path = child.dump_stacks(out)
            self.log.event("stacks", f"stacks of the trainer and its workers written to {path}", path=str(path))
        except Exception as e:  # a dump must never block recovery
            path = None
            self.log.event("stacks", f"could not dump stacks: {e}")
        return AttemptEnd(
            AttemptState.STALLED,
            f"hang at {at}",
            hb=hb,
            stderr=child.stderr_tail(self.mark),
            detected=detected,
            at=now,
            stalled=round(stalled, 1),
            stacks=path,
            cgroup=self._ends(),
            threads=threads,
        )
