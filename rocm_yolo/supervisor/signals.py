"""What the supervisor does with the signals a terminal and a scheduler send it.

The training tree runs in a session of its own, so a signal to the user's shell job reaches the
supervisor only, and the supervisor acts for the tree: SIGINT, SIGTERM and SIGHUP (the terminal
went away) stop the run; SIGTSTP (Ctrl-Z) stops the whole tree with the supervisor, and SIGCONT
(``fg``, ``bg``) continues both. A signal the caller set to be ignored stays ignored: SIGHUP under
``nohup``, SIGINT in a shell's background job. The handlers only record; the loop acts.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from rocm_yolo import errors
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.run.events import RunLog
from rocm_yolo.supervisor.stall import StallDetector
from rocm_yolo.supervisor.trainer_process import Child

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_this_process() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


class Signals:
    def __init__(self, stop_self: Callable[[], None] = _stop_this_process):
        self.interrupted: int | None = None  # the stop signal received
        self.suspend_requested = False  # Ctrl-Z received, not yet acted on
        self.stop_self = stop_self  # Ctrl-Z: stops this process until the shell continues it

    def exit_code(self) -> int:
        """The run's exit code for the stop signal received: 130 (Ctrl-C), 129 (SIGHUP), else 143 (SIGTERM)."""
        return {signal.SIGINT: errors.INTERRUPTED, signal.SIGHUP: errors.HANGUP}.get(
            self.interrupted, errors.TERMINATED
        )

    def name(self) -> str:
        return signal_name(self.interrupted) if self.interrupted else "signal"

    def _on_stop(self, signum, frame) -> None:
        self.interrupted = signum

    def _on_suspend(self, signum, frame) -> None:
        self.suspend_requested = True

    def install(self) -> dict:
        """Install the handlers (on the main thread); the previous ones, to put back."""
        handlers = {sig: self._on_stop for sig in STOPS}
        handlers[signal.SIGTSTP] = self._on_suspend
        previous = {}
        for sig, handler in handlers.items():
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        return previous

    def suspend(self, child: Child, detector: StallDetector, log: RunLog, clock: Callable[[], float]) -> None:
        """Ctrl-Z: stop the training tree and this process; when the shell continues this one, continue the tree.
        The time stopped is no hang."""
        self.suspend_requested = False
        log.event("suspended", "stopped (SIGTSTP): the training process tree is stopped too; fg or bg continues")
        began = clock()
        child.pause()
        try:
            self.stop_self()  # the shell sees the job stopped; SIGCONT goes on from here
        finally:
            child.unpause()
        detector.pause(clock() - began)
        log.event("continued", "continued: the training process tree goes on")
