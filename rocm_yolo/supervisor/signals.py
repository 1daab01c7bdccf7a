"""What the supervisor does with the signals a terminal and a scheduler send it.

The training tree runs in a session of its own, so a signal to the user's shell job reaches the
supervisor only, and the supervisor acts for the tree: SIGINT, SIGTERM and SIGHUP (the terminal
went away) stop the run, and the first of them is the cause it names (a terminal that closes on a
stopped job sends SIGHUP, SIGTERM and SIGCONT at once: the hang-up is the cause); SIGTSTP (Ctrl-Z)
stops the whole tree with the supervisor, and SIGCONT (``fg``, ``bg``) continues both, unless a stop
came meanwhile: then the tree is not continued to train, it is stopped. SIGTTOU and SIGTTIN (a
background job that writes to or reads from a terminal with ``stty tostop``) stop the whole tree with
the supervisor too, as they stop a plain job: the tree never trains unwatched. A signal the caller
set to be ignored stays ignored: SIGHUP under ``nohup``, SIGINT in a shell's background job. The
handlers only record, but SIGTTOU's and SIGTTIN's act at once: the write that raised them retries
until the job is in the foreground, and the job stops once for it, however many times the write
is tried (one ``fg`` continues it; the time stopped counts once). A job stopped either way, whose
terminal then goes away, ends: the hang-up's SIGHUP is its cause, and the tree, not continued, is
stopped for good (exit 129).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

from rocm_yolo import errors
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.process.output import RunLog
from rocm_yolo.process.terminal import in_foreground
from rocm_yolo.supervisor.stall import StallDetector
from rocm_yolo.supervisor.trainer_process import Child

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINAL_STOPS = (signal.SIGTTOU, signal.SIGTTIN)  # job control: a background job at its terminal


def _stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


class Signals:
    def __init__(
        self,
        stop_self: Callable[[], None] = _stop_this_process,
        foreground: Callable[[], bool | None] = in_foreground,
    ):
        self.interrupted: int | None = None  # the first stop signal received: the run's cause
        self.suspend_requested = False  # Ctrl-Z received, not yet acted on
        self.stop_self = stop_self  # Ctrl-Z: stops this process until the shell continues it
        self.foreground = foreground  # whether the job is its terminal's foreground job (None: no terminal)
        self.suspended_seconds = 0.0  # time the run spent stopped by Ctrl-Z (no training time)
        self.child: Child | None = None  # the attempt's tree, while one runs (SIGTTOU stops it at once)
        self.unaccounted = 0.0  # seconds stopped by SIGTTOU/SIGTTIN that the watch has not taken off yet
        self.terminal_stops: list[int] = []  # SIGTTOU/SIGTTIN stops not said yet (said once the job can write)
        self.stopping = False  # a SIGTTOU/SIGTTIN stop in progress: the signals its retried writes raise are its own

    def exit_code(self) -> int:
        """The run's exit code for the stop signal received: 130 (Ctrl-C), 129 (SIGHUP), else 143 (SIGTERM)."""
        return {signal.SIGINT: errors.INTERRUPTED, signal.SIGHUP: errors.HANGUP}.get(
            self.interrupted, errors.TERMINATED
        )

    def name(self) -> str:
        return signal_name(self.interrupted) if self.interrupted else "signal"

    def _on_stop(self, signum, frame) -> None:
        if self.interrupted is None:  # the first is the cause: what follows it within a moment is its echo
            self.interrupted = signum

    def _on_suspend(self, signum, frame) -> None:
        self.suspend_requested = True

    def _on_terminal(self, signum, frame) -> None:
        """SIGTTOU/SIGTTIN: stop the tree and this process now, as the shell's job control stops a plain job (no
        line written here: the write would raise it again); continued in the foreground, the write goes on.

        Once per stop: a write that raised it retries until the job is continued, and each try raises it again (the
        thread that relays the trainer's stderr, while the main thread runs this handler): a signal that comes while
        the job is being stopped, or that finds the job in the foreground once continued (``fg``), is the same stop's,
        and stops nothing. Continued in the background (``bg``), the next write stops the job again, as any job's."""
        if self.stopping or self.foreground() is True:
            return
        self.stopping = True
        began = time.monotonic()
        child = self.child
        try:
            if child is not None:
                child.pause()
            self.stop_self()
        finally:
            if child is not None and self.interrupted is None:
                child.unpause()
            stopped = time.monotonic() - began
            self.unaccounted += stopped
            self.suspended_seconds += stopped
            self.terminal_stops.append(signum)
            self.stopping = False

    def install(self) -> dict:
        """Install the handlers (on the main thread); the previous ones, to put back."""
        handlers = {sig: self._on_stop for sig in STOPS}
        handlers[signal.SIGTSTP] = self._on_suspend
        handlers.update({sig: self._on_terminal for sig in TERMINAL_STOPS})
        previous = {}
        for sig, handler in handlers.items():
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        return previous

    def suspend(self, child: Child, detector: StallDetector, log: RunLog, clock: Callable[[], float]) -> None:
        """Ctrl-Z: stop the training tree and this process; when the shell continues this one, continue the tree,
        unless a stop came while it was stopped. The time stopped is no hang."""
        self.suspend_requested = False
        log.event("suspended", "stopped (SIGTSTP): the training process tree is stopped too; fg or bg continues")
        began = clock()
        child.pause()
        try:
            self.stop_self()  # the shell sees the job stopped; SIGCONT goes on from here
        finally:
            if self.interrupted is None:  # a stop while stopped (the terminal closed): the tree trains no more
                child.unpause()
        detector.pause(clock() - began)
        self.suspended_seconds += clock() - began
        if self.interrupted is None:
            log.event("continued", "continued: the training process tree goes on")

    def settle(self, detector: StallDetector, log: RunLog) -> None:
        """What SIGTTOU/SIGTTIN stops left to do, once the loop runs: the time stopped is no hang; say it."""
        if self.unaccounted:
            detector.pause(self.unaccounted)
            self.unaccounted = 0.0
        while self.terminal_stops:
            name = signal_name(self.terminal_stops.pop(0))
            log.event(
                "suspended",
                f"stopped ({name}): a background job at a terminal with stty tostop; the training process tree "
                "was stopped too, and goes on with the job",
                signal=name,
            )
