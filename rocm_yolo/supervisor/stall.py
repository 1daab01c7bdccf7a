"""``StallDetector``: whether a run has stopped making progress. Knows nothing about processes."""

from __future__ import annotations

import time
from collections import deque

from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.supervisor.config import WatchdogConfig


class StallDetector:
    """Decides whether a run has stopped making progress.

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

    def pause(self, seconds: float) -> None:
        """The run was stopped on purpose (Ctrl-Z) for ``seconds``: not time without progress."""
        self.last_progress += seconds

    def timeout(self) -> float:
        t = max(self.config.stall_timeout, self.config.step_multiplier * max(self.steps, default=0.0))
        if not self.trained:
            t = max(t, self.config.startup_grace)
        return t

    def stalled_for(self, now: float) -> float:
        return now - self.last_progress

    def stalled(self, now: float) -> bool:
        return self.stalled_for(now) > self.timeout()


def ranks_heard(ranks: dict) -> str:
    """On several GPUs, where each rank was last heard: the one that stopped first is the one that hangs."""
    if len(ranks) < 2:
        return ""
    wall = time.time()
    heard = ", ".join(
        f"rank {r} at {hb.phase} batch {hb.batch}/{hb.batches} {max(wall - hb.time, 0):.0f} s ago"
        for r, hb in sorted(ranks.items())
    )
    return f" (last heard: {heard})"
