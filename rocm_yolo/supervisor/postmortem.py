"""What failed: a stalled or crashed attempt's end (:class:`.watch.AttemptEnd`), its evidence gathered and
diagnosed, its report written, and the remedy for it decided.

The evidence is the exit, the stderr before and since the last progress, a hang's stacks, and the kernel log's lines
of this attempt's own processes within its time, and beyond the text: the run's cgroup's OOM kills, a hang's
threads as the kernel saw them, the labels after an index error, the GPU override against the cards
(:mod:`rocm_yolo.diagnosis.evidence`); the class follows the
runtimes' own texts (:mod:`rocm_yolo.diagnosis.diagnose`); the remedy, the run's earlier failures and the machine
(:mod:`rocm_yolo.diagnosis.remedies`). What :func:`diagnose_end` returns goes into the run's record
(:meth:`Diagnosed.record`) and is said (:meth:`Diagnosed.say`) when the loop (:mod:`.loop`) asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.diagnosis import evidence, remedies
from rocm_yolo.diagnosis.diagnose import diagnose
from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.diagnosis.record import Diagnosis
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Failure, Hang, SupervisorState
from rocm_yolo.supervisor.reporting import Reporter
from rocm_yolo.supervisor.states import AttemptState
from rocm_yolo.supervisor.watch import AttemptEnd, where


@dataclass
class Diagnosed:
    """One failed attempt, understood: the record of it, what it was, what to do, where it happened."""

    failure: Failure  # for supervisor.json's failures (its remedy set)
    diagnosis: Diagnosis
    decision: remedies.Decision
    where: str  # "epoch 2/3, batch 1/4", or the start-up step
    report: Path | None  # the hang's stacks or the crash's report, with the diagnosis at its head

    def record(self, result: SupervisorState) -> None:
        """Into the run's record: the failure, and a hang's class and signature (its :class:`Hang`, recorded when the
        hang was noticed: :func:`hang_of`)."""
        result.failures.append(self.failure)
        if self.failure.kind == "hang" and result.hangs:
            result.hangs[-1].cls, result.hangs[-1].signature = self.diagnosis.cls, self.diagnosis.signature

    def say(self, reporter: Reporter, spec: RunSpec, end: AttemptEnd) -> None:
        """The failure said: on the terminal, in events.jsonl, to the notify command and in metrics.prom."""
        failure, diagnosis = self.failure, self.diagnosis
        hang = end.state == AttemptState.STALLED
        details = f"; details in {self.report}" if self.report else ""
        reporter.event(
            failure.kind,
            f"{diagnosis.title} at {self.where} (attempt {spec.attempt}){details}",
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


def diagnose_end(
    spec: RunSpec,
    end: AttemptEnd,
    *,
    pids: set[int],
    began: float,
    ended: float,
    machine: Machine,
    kernel_log: str | None,
    earlier: list[Failure],
) -> Diagnosed:
    """Diagnose the attempt of ``spec`` that ended as ``end`` (STALLED or CRASHED): ``pids`` its processes,
    ``began``/``ended`` its wall-clock span (the kernel log's lines outside it are not its), ``kernel_log`` a file
    read instead of the system's, ``earlier`` this run's failures before it (the remedy counts them)."""
    hang = end.state == AttemptState.STALLED
    report = spec.paths.hang_stacks(spec.attempt) if hang else spec.paths.crash(spec.attempt)
    found = evidence.gather(
        spec,
        "hang" if hang else "crash",
        exit_code=end.exit_code,
        stderr=end.stderr,
        stacks=report if hang and report.is_file() else None,
        kernel_path=kernel_log,
        window=(began, ended),
        pids=pids,
        gpus=machine.gpus,
        cgroup=end.cgroup,
        threads=end.threads,
        phase=end.hb.phase if end.hb else None,
    )
    diagnosis = diagnose(found)
    at = where(end.hb)
    written = evidence.write_report(report, diagnosis, found, at)
    failure = evidence.failure(spec.attempt, found.failure, diagnosis, end.hb, end.detected, written)
    decision = remedies.decide(failure, diagnosis, earlier, evidence.context(spec, machine, diagnosis, found))
    failure.remedy = decision.action
    return Diagnosed(failure, diagnosis, decision, at, written)


def hang_of(end: AttemptEnd) -> Hang:
    """The record of a hang the watch noticed (its class and signature follow once diagnosed)."""
    hb = end.hb
    return Hang(
        epoch=hb.epoch if hb else None,
        batch=hb.batch if hb else None,
        phase=hb.phase if hb else None,
        stalled_seconds=end.stalled,
        stacks=str(end.stacks) if end.stacks else None,
        detected=end.detected,
    )
