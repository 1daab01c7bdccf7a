"""``StallDetector``: whether a run has stopped making progress. Knows nothing about processes: what the kernel says
of them (their state, CPU time and I/O bytes, :mod:`rocm_yolo.process.kernel_view`) is given to it."""

from __future__ import annotations

import time
from collections import deque

from rocm_yolo.errors import OK
from rocm_yolo.process.kernel_view import STOPPED, ProcessMove
from rocm_yolo.run.heartbeat import FIRST_BATCH, Heartbeat
from rocm_yolo.supervisor.config import WatchdogConfig

# On several GPUs, once a rank has said it ends (its exit line), the attempt is ending; how long its
# tree may take to go, from the newest exit line, before the end itself counts as a hang:
STOP_GRACE = 60.0  # a rank failed or was stopped: torch.distributed.run stops the others (SIGTERM, 30 s, SIGKILL)
FINISH_GRACE = 330.0  # every rank of this node finished: torch's agent waits for the other nodes (its exit barrier,
# 300 s), and the store it hosts serves them meanwhile
STOPPING, FINISHED = "stopping", "finished"
# A start-up moves when its processes, together, used this much CPU or read and wrote this many bytes since it last
# moved (a process that starts moves too): imports, a data set's scan and its cache do, a process stopped or stuck
# in the kernel (a driver's first ioctl, an NFS mount gone away) does not.
MOVE_CPU = 0.5  # seconds
MOVE_IO = 64 << 10  # bytes (a slow download moves too)


class StallDetector:
    """Decides whether a run has stopped making progress.

    Progress is a new heartbeat sequence number. The timeout adapts to the run: the larger of
    the floor and ``step_multiplier`` times the slowest step seen in the recent heartbeats
    (the first step of a pass, which includes worker start-up, is not counted by the writer).
    Until the first training batch of the attempt, the startup grace applies (data set scan
    and cache, worker start-up, GPU kernel tuning). On several GPUs, a rank's exit line is
    progress too, and from the first one the attempt is ``ending``: the time its ranks and torch's
    agent take to go (a crash's teardown, the exit barrier of a node that finished first) is no
    hang within :data:`STOP_GRACE` or :data:`FINISH_GRACE`.

    The start-up allowance is for a start-up that moves: fed the attempt's processes' counters
    (:meth:`observe_movement`), a start-up whose processes have not moved for the stall timeout (the floor) is a
    hang then, whatever the allowance; so is one whose processes were stopped by someone else than the supervisor's
    own job control (its time stopped is given to :meth:`pause`, and it continues the tree before it watches again).
    """

    def __init__(self, config: WatchdogConfig, now: float, window: int = 30, startup: float | None = None):
        self.config = config
        self.startup = config.startup_grace if startup is None else startup
        self.startup_step = ""  # what the attempt does before its first trained batch (Heartbeat.startup)
        self.last_progress = now
        self.last_seq: int | None = None
        self.trained = False
        self.steps: deque[float] = deque(maxlen=window)
        self.exits = 0  # ranks that said they end
        self.ending: str | None = None  # STOPPING or FINISHED once a rank said it ends
        self.moved: dict[int, ProcessMove] | None = None  # the counters when the attempt's processes last moved
        self.moved_at = now
        self.stopped: dict[int, str] = {}  # processes stopped (state T or t) from outside: pid -> state
        self.stopped_at = now

    def observe(self, hb: Heartbeat | None, now: float) -> bool:
        """Feed the latest heartbeat; True when it shows progress."""
        if hb is None or hb.seq == self.last_seq:
            return False
        self.last_seq = hb.seq
        self.last_progress = now
        if hb.batches_total > 0:
            self.trained = True
        self.startup_step = "" if self.trained else hb.startup
        if hb.step_max > 0:
            self.steps.append(hb.step_max)
        return True

    def observe_exits(self, exits: dict[int, int], ranks: int, now: float) -> bool:
        """Feed the exit codes the ranks said so far (``ranks``: how many this node runs); True when one is new."""
        if len(exits) <= self.exits:
            return False
        self.exits = len(exits)
        self.last_progress = now
        done = len(exits) >= ranks and all(code == OK for code in exits.values())
        self.ending = FINISHED if done else STOPPING
        return True

    def observe_movement(self, found: dict[int, ProcessMove] | None, now: float) -> bool:
        """Feed the attempt's processes' counters (None: not readable); True when they moved."""
        if found is None:
            return False
        stopped = {pid: m.state for pid, m in found.items() if m.state in STOPPED}
        if stopped and not self.stopped:
            self.stopped_at = now
        self.stopped = stopped
        if self.moved is None or _moved(self.moved, found):
            self.moved, self.moved_at = found, now
            return True
        return False

    def pause(self, seconds: float) -> None:
        """The run was stopped on purpose (Ctrl-Z) for ``seconds``: not time without progress, nor without
        movement."""
        self.last_progress += seconds
        self.moved_at += seconds
        self.stopped_at += seconds

    def timeout(self) -> float:
        t = max(self.config.stall_timeout, self.config.step_multiplier * max(self.steps, default=0.0))
        if not self.trained and self.startup_step != FIRST_BATCH:
            t = max(t, self.startup)
        if self.ending is not None:
            t = max(t, FINISH_GRACE if self.ending == FINISHED else STOP_GRACE)
        return t

    def stalled_for(self, now: float) -> float:
        return now - self.last_progress

    def floor(self) -> float:
        """The stall timeout as training has it (the start-up allowance aside)."""
        return max(self.config.stall_timeout, self.config.step_multiplier * max(self.steps, default=0.0))

    def still_for(self, now: float) -> float:
        """Seconds the attempt's processes have not moved (0 when no reading came)."""
        return max(now - self.moved_at, 0.0) if self.moved is not None else 0.0

    def still(self, now: float) -> bool:
        """A start-up that has not moved for the stall timeout, or whose processes have been stopped from outside
        that long: a hang, though its allowance is longer."""
        if self.trained or self.ending is not None or self.timeout() <= self.floor():
            return False
        floor = self.floor()
        stopped = bool(self.stopped) and now - self.stopped_at > floor
        return self.stalled_for(now) > floor and (self.still_for(now) > floor or stopped)

    def stalled(self, now: float) -> bool:
        return self.stalled_for(now) > self.timeout() or self.still(now)

    def why_still(self, now: float) -> str:
        """What the kernel said of a start-up found :meth:`still`: for the hang line."""
        said = f"its processes have not moved (CPU time, I/O) for {self.still_for(now):.0f} s"
        if self.stopped:
            pids = ", ".join(str(p) for p in self.stopped)
            said += f" and pid {pids} {'is' if len(self.stopped) == 1 else 'are'} stopped (not by rocm-yolo's Ctrl-Z)"
        return f"{said}: the {self.startup:.0f} s start-up allowance is for a start-up that moves"


def _moved(before: dict[int, ProcessMove], now: dict[int, ProcessMove]) -> bool:
    """Whether the processes ``now`` used :data:`MOVE_CPU` or read and wrote :data:`MOVE_IO` since ``before``, or
    one of them started since (a pid of another process than before is another one)."""
    cpu = io = 0.0
    for pid, m in now.items():
        was = before.get(pid)
        if was is None or was.start != m.start:
            return True
        cpu += max(m.cpu - was.cpu, 0.0)
        io += max(m.io - was.io, 0) if m.io >= 0 and was.io >= 0 else 0
    return cpu >= MOVE_CPU or io >= MOVE_IO


class Startup:
    """How long the run took to start training: the first attempt that trained, from its child's start to its first
    trained batch. A restart meets the same slow steps (or fewer: the labels are cached, the GPU kernels tuned), so
    its start-up allowance is ``restart_startup_factor`` times that, within the stall timeout and the startup grace,
    instead of the startup grace meant for a first start nobody has measured."""

    def __init__(self) -> None:
        self.seconds: float | None = None

    def observe(self, hb: Heartbeat, since_start: float) -> None:
        """A heartbeat ``since_start`` seconds after its attempt's child started."""
        if self.seconds is None and hb.batches_total > 0:
            self.seconds = since_start

    def allowance(self, config: WatchdogConfig) -> float | None:
        """A restart's start-up allowance; None (the startup grace) until a first start-up was measured."""
        if self.seconds is None:
            return None
        return min(config.startup_grace, max(config.stall_timeout, config.restart_startup_factor * self.seconds))


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


def ending_note(detector: StallDetector, exits: dict[int, int]) -> str:
    """A hang while the ranks end: which said they end (the others did not stop in :data:`STOP_GRACE`)."""
    if detector.ending != STOPPING:
        return ""
    return f" (after rank(s) {', '.join(map(str, sorted(exits)))} ended, the others did not stop)"


def lingering(seconds: float) -> str:
    """Every rank finished, and torch's agent is still there after :data:`FINISH_GRACE`: the line that stops it."""
    return f"every rank finished training; torch.distributed.run had not exited {seconds:.0f} s later: stopped it"
