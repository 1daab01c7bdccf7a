"""The one set of test fakes for the supervisor: a fake clock, a heartbeat builder and a scripted child.

The supervisor's loop is tested as torch elastic tests its agent: with scripted results instead
of real processes (:class:`ScriptedChild` keeps the :class:`rocm_yolo.supervisor.trainer_process.Child`
protocol); the end-to-end tests use the real thing.
"""

from __future__ import annotations

import os
from pathlib import Path

from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.supervisor.loop import Supervisor


class Clock:
    """A monotonic clock that moves only when the code under test sleeps."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        self.now += dt


def beat(
    seq: int,
    *,
    epoch: int = 1,
    batch: int = 1,
    batches_total: int = 1,
    batches: int = 50,
    phase: str = "train",
    step: float = 1.0,
    it_s: float | None = None,
    pid: int = 100,
    t: float = 0.0,
    epochs: int = 3,
    rank: int = 0,
    startup: str = "",
) -> Heartbeat:
    """A heartbeat record (``t``: the trainer's wall clock of the write; ``it_s`` defaults to 1 / ``step``)."""
    return Heartbeat(
        seq=seq,
        pid=pid,
        attempt=1,
        phase=phase,
        epoch=epoch,
        epochs=epochs,
        batch=batch,
        batches=batches,
        step_max=step,
        step_last=step,
        batches_total=batches_total,
        it_s=1 / step if it_s is None else it_s,
        time=t,
        started=0,
        rank=rank,
        local_rank=rank,  # one machine: its rank among the node's
        startup=startup,
    )


class ScriptedChild:
    """A fake training child: ``beats`` maps a clock time to the heartbeat it sends then; it exits with ``code``
    at ``exit_at`` (None: never, it goes silent). On several GPUs (``rank_count``), ``exit_lines`` maps a clock
    time to the ``(rank, code)`` a rank's exit line says then."""

    def __init__(
        self,
        clock,
        beats: dict,
        *,
        pid: int = 100,
        exit_at: float | None = None,
        code: int = 0,
        stderr: str = "",
        earlier: str = "",
        stacks: str = "stacks",
        exit_lines: dict | None = None,
        rank_count: int = 1,
        moves: dict | None = None,
        threads: tuple = (),
    ):
        self.clock, self.events, self.pid, self.exit_at, self.code = clock, sorted(beats.items()), pid, exit_at, code
        self.exit_lines = sorted((exit_lines or {}).items())  # on several GPUs: clock time -> (rank, exit code) said
        self.stderr = stderr  # what it wrote to stderr since its last progress (the HSA runtime's last words, say)
        self.earlier = earlier  # what it wrote before its last progress: context, never the class
        self.stacks = stacks  # what a stack dump of it finds
        self.ranks: dict[int, Heartbeat] = {}
        self.exits: dict[int, int] = {}  # the exit lines due so far, as the pipe gives them
        self.rank_count = rank_count
        self.seen = 0
        self.dumped = self.killed = False
        self.terminal_blocked = False  # a test sets it: the tree waits for its terminal (Ctrl-S)
        self.terminal_blocked_pid = pid
        self.moves = sorted((moves or {}).items())  # clock time -> what /proc says of its processes then (None: unread)
        self.thread_view = threads  # what the kernel says of its threads at a hang

    def poll(self) -> int | None:
        return self.code if self.exit_at is not None and self.clock() >= self.exit_at else None

    def heartbeats(self) -> list[Heartbeat]:
        """The scripted heartbeats due since the last call, as the pipe gives them."""
        due = [hb for t, hb in self.events if t <= self.clock()]
        new, self.seen = due[self.seen :], len(due)
        for hb in new:
            self.ranks[hb.rank] = hb
        self.exits.update(said for t, said in self.exit_lines if t <= self.clock())
        return new

    def dump_stacks(self, out: Path) -> Path:
        self.dumped = True
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.stacks)
        return out

    def pids(self) -> list[int]:
        return [self.pid]

    def stderr_mark(self, at: float) -> int:
        return 0

    def stderr_tail(self, since: int | None = None) -> tuple[str, str]:
        return self.earlier, self.stderr

    def blocked_on_terminal(self) -> int | None:
        return self.terminal_blocked_pid if self.terminal_blocked else None

    def threads(self) -> tuple:
        return self.thread_view

    def movement(self) -> dict | None:
        """The scripted reading due now (the newest at or before the clock), None before the first or without any."""
        due = [m for t, m in self.moves if t <= self.clock()]
        return due[-1] if due else None

    def kill(self) -> list[int]:
        self.killed = True
        return []

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False


def supervisor(spec, children, clock: Clock, config, made: list | None = None, **kw) -> Supervisor:
    """A supervisor whose attempts are ``children`` in turn (the specs they were made for go into ``made``)."""
    made = [] if made is None else made

    def factory(s, c):
        made.append(s)
        return children[len(made) - 1]

    return Supervisor(
        spec,
        config,
        child_factory=factory,
        clock=clock,
        sleep=clock.sleep,
        log=RunLog(stream=open(os.devnull, "w")),
        **{"machine": Machine(), **kw},  # no GPU unless a test gives one
    )


def supervise(spec, children, clock: Clock, config, **kw):
    """Run a :func:`supervisor` to its end: (the result, the specs of its attempts)."""
    made: list = []
    return supervisor(spec, children, clock, config, made, **kw).run(), made


def suspended(spec, child, clock: Clock, config, at: float, seconds: float) -> Supervisor:
    """A supervisor of ``child`` that gets Ctrl-Z at clock time ``at`` and is continued ``seconds`` later (its
    ``stop_self`` stands for the shell's job control: the clock runs on while it is stopped)."""

    def stop_self():
        clock.now += seconds

    def sleep(dt):
        clock.sleep(dt)
        if clock.now == at:
            sup.signals.suspend_requested = True

    sup = Supervisor(
        spec,
        config,
        child_factory=lambda s, c: child,
        clock=clock,
        sleep=sleep,
        log=RunLog(stream=open(os.devnull, "w")),
        stop_self=stop_self,
    )
    return sup
