"""Work lost to restarts, from heartbeats: where an attempt stopped, where the next one resumed, what it retrained.

A restart costs the time to notice the hang, the restart itself (stack dump, kill, new process,
resume, worker start-up) and the batches trained again: those between the checkpoint the new
attempt resumed from and the position the failed attempt had reached. :class:`RecoveryTracker` turns
the supervisor's heartbeats into one :class:`~rocm_yolo.run.supervisor_state.Recovery` per restart::

    Recovery(attempt=2, cause="hang", lost_at=[2, 4886], resumed_at=[2, 4880], batches=41163,
             retrained_batches=6, detect_seconds=180.4, restart_seconds=31.2, retrain_seconds=2.3, ...)

Positions are ``[epoch, batches done in it]`` (1-based epoch), as of the last heartbeat (at
most a second old). ``retrain_seconds`` is measured by the trainer's own clock (the heartbeats'
``time``): from the new attempt's first batch until it is back where the old one stopped, so it
does not depend on how often the supervisor reads them. Knows nothing about processes; no torch.

:class:`Recoveries` keeps what it finds in the run's record (``supervisor.json``'s ``recoveries`` and
``lost_seconds``: the time hangs cost, from their notice to the next attempt back where the hung one was).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.process.output import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Recovery, SupervisorState


@dataclass
class _Failure:  # an attempt that failed, until the next one trains its first batch
    cause: str
    lost_at: list | None
    batches: int
    detect_seconds: float
    failed_at: float
    failure: str | None = None  # its class (diagnosis.diagnose)


class RecoveryTracker:
    def __init__(self):
        self.records: list[Recovery] = []
        self.batches = 0  # training batches per epoch, from the latest training heartbeat
        self.at: list[int] | None = None  # the furthest position of the current attempt
        self.pending: _Failure | None = None  # a failed attempt, until the next one trains
        self.retraining: tuple[Recovery, int, float] | None = None  # (record, target, first batch's heartbeat time)
        self.last_time = 0.0  # the newest heartbeat's time

    def _index(self, position) -> int:
        return (position[0] - 1) * self.batches + position[1]

    def observe(self, hb: Heartbeat) -> Recovery | None:
        """Feed a new heartbeat; returns the record whose retraining just finished, if any."""
        self.last_time = hb.time
        if hb.phase == "train" and hb.epoch > 0:
            self.batches = hb.batches
            self.at = [hb.epoch, hb.batch]
        elif hb.phase in ("val", "save", "done") and hb.epoch > 0 and self.batches:
            self.at = [hb.epoch, self.batches]  # the epoch's training is done
        if self.retraining is None or self.at is None:
            return None
        record, target, since = self.retraining
        if self._index(self.at) >= target:
            return self._finish_retraining()
        return None

    def _finish_retraining(self) -> Recovery:
        record, target, since = self.retraining
        record.retrain_seconds = round(max(self.last_time - since, 0.0), 1)
        self.retraining = None
        return record

    def failed(
        self, cause: str, now: float, detect_seconds: float = 0.0, failure: str | None = None
    ) -> Recovery | None:
        """An attempt stalled or crashed (``failure``: its class); returns a record still retraining it cut short."""
        cut = self._finish_retraining() if self.retraining is not None else None
        self.pending = _Failure(cause, self.at, self.batches, round(detect_seconds, 1), now, failure)
        self.at = None
        return cut

    def resumed(self, hb: Heartbeat, attempt: int, checkpoint: str | None, now: float) -> Recovery | None:
        """The next attempt trained its first batch (``hb``); returns the finished record, None if nothing failed."""
        failure, self.pending = self.pending, None
        if failure is None:
            return None
        start = [hb.epoch, hb.batch - hb.batches_total] if 0 <= hb.batches_total <= hb.batch else None
        record = Recovery(
            attempt=attempt,
            cause=failure.cause,
            lost_at=failure.lost_at,
            resumed_at=start,
            batches=failure.batches,
            checkpoint=checkpoint,
            retrained_batches=None,
            detect_seconds=failure.detect_seconds,
            restart_seconds=round(now - failure.failed_at, 1),
            retrain_seconds=0.0,
            failure=failure.failure,
        )
        lost = failure.lost_at
        if lost is not None and start is not None and failure.batches == hb.batches:
            self.batches = hb.batches
            retrained = max(self._index(lost) - self._index(start), 0)
            record.retrained_batches = retrained
            if retrained > hb.batches_total:  # not yet back where it was
                self.retraining = (record, self._index(lost), hb.time)
            elif retrained and hb.it_s > 0:  # already back by this heartbeat (fast batches): from the speed
                record.retrain_seconds = round(retrained / hb.it_s, 1)
        self.records.append(record)
        return record


class Recoveries:
    """The run's recoveries and the time its hangs cost, kept in its record (``result``), from the failed attempts
    and the heartbeats after them (a :class:`RecoveryTracker`)."""

    def __init__(self, result: SupervisorState):
        self.result = result
        self.work = RecoveryTracker()
        self._since: float | None = None  # a hang's notice (the loop's clock), until the next attempt is heard

    @property
    def pending(self) -> _Failure | None:
        """The failed attempt the next one recovers from (its child tags the tracker run with it), if any."""
        return self.work.pending

    def hung(self, stalled: float, at: float) -> None:
        """A hang noticed at ``at`` after ``stalled`` seconds without progress: both count, and so does the time until
        the next attempt is heard."""
        self.result.lost_seconds += stalled
        self._since = at

    def failed(self, cause: str, at: float, stalled: float, cls: str | None) -> None:
        """An attempt stalled or crashed (``cause``: hang or crash; ``cls``: its class)."""
        self._retrained(self.work.failed(cause, at, stalled, cls))

    def progress(self, hb: Heartbeat) -> None:
        self._retrained(self.work.observe(hb))

    def resumed(self, now: float, spec: RunSpec, hb: Heartbeat, log: RunLog) -> bool:
        """The attempt of ``spec`` is heard for the first time (``hb``): the restart's time counts, its recovery is
        recorded and what it trains again said; whether the record changed."""
        since = self._since
        if since is not None:
            self.result.lost_seconds += now - since
            self._since = None
        record = self.work.resumed(hb, spec.attempt, Path(spec.resume).name if spec.resume else None, now)
        if record is not None:
            self.result.recoveries.append(record)
            if record.retrained_batches is not None:
                at = record.resumed_at
                log.event(
                    "retraining",
                    f"attempt {spec.attempt} resumed at epoch {at[0]}, batch {at[1]:,}: "
                    f"{record.retrained_batches:,} batch(es) to train again",
                    attempt=spec.attempt,
                    batches=record.retrained_batches,
                )
            self._retrained(None if record.retrained_batches and self.work.retraining else record)
        return since is not None or record is not None

    def _retrained(self, record: Recovery | None) -> None:
        """A restart's retraining is over: a hang's time lost includes it."""
        if record is not None and record.cause == "hang":
            self.result.lost_seconds += record.retrain_seconds or 0.0
