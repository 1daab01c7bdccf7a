"""Shell commands run in the background, each with a few bytes on its standard input, bounded in time.

The watchdog's notifications (``--notify CMD``) run this way: a command that fails, hangs or does not exist must
never delay or break the run. :class:`BackgroundCommands` starts each command through ``/bin/sh -c`` in its own
session (Ctrl-C in the terminal does not reach it; it dies with this process even when this one is SIGKILLed),
writes its input without ever blocking, and is polled: a command that exited is reaped, one past its timeout is
killed with its whole session, and the first failure is said once (later ones are only counted). A command that
exited is swept (what it left in its session is killed) before it is reaped, while its session id is still its
own: never another's that got the number since (:class:`rocm_yolo.process.tree.Tree`). The commands run
one after another, in the order they were given, so that what they deliver arrives in order. :meth:`close` gives
the commands still running or waiting a few seconds, then kills them: none is left once the caller is done.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from rocm_yolo.process.tree import Tree, kill_now, start

MAX_WAITING = 32  # more waiting and the oldest is dropped: a notifier that never returns must not pile them up


@dataclass
class _Running:
    proc: Tree  # the shell, unreaped until its session is swept
    err: object  # a temporary file: the command's stderr, for the one line that says why it failed
    started: float


class BackgroundCommands:
    def __init__(self, timeout: float, on_failure: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.timeout = timeout
        self.on_failure = on_failure
        self.clock = clock
        self.running: list[_Running] = []  # at most one: the commands run one after another, in order
        self.waiting: list[tuple[str, bytes, dict | None]] = []
        self.failures = 0
        self.started = 0

    def start(self, command: str, data: bytes, env: dict | None = None) -> None:
        """Run ``command`` with ``data`` on its standard input once the ones before it are done; returns at once."""
        if len(self.waiting) >= MAX_WAITING:
            self.waiting.pop(0)
            self._failed("too many waiting behind one that does not return: the oldest dropped")
        self.waiting.append((command, data, env))
        self.poll()

    def _launch(self, command: str, data: bytes, env: dict | None) -> None:
        err = tempfile.TemporaryFile()
        try:
            proc = start(["/bin/sh", "-c", command], env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        except OSError as e:
            err.close()
            self._failed(f"cannot start it: {e.strerror or e}")
            return
        self.started += 1
        try:
            os.set_blocking(proc.stdin.fileno(), False)
            os.write(proc.stdin.fileno(), data)  # one small object: the pipe holds it; never waits for a reader
        except OSError:
            pass  # it exited already, or does not read its input: its exit status tells
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
        self.running.append(_Running(Tree(proc), err, self.clock()))

    def poll(self) -> None:
        """Reap the command that exited (a failure is said once) or kill it past its timeout; start the next."""
        still = []
        for job in self.running:
            code = job.proc.exited()  # not reaped: its session id is its own until the sweep
            if code is None and self.clock() - job.started >= self.timeout:
                self._kill(job, f"no answer within {self.timeout:g} s: killed")
            elif code is None:
                still.append(job)
            else:
                if code != 0:
                    self._failed(f"exit {code}" + _first_line(job.err))
                kill_now(job.proc, timeout=1.0)  # whatever it left running in its session goes; then it is reaped
                job.err.close()
        self.running = still
        while not self.running and self.waiting:
            self._launch(*self.waiting.pop(0))

    def close(self, grace: float) -> None:
        """Give the commands still running or waiting up to ``grace`` seconds in all, then kill the rest."""
        deadline = self.clock() + grace
        self.poll()
        while (self.running or self.waiting) and self.clock() < deadline:
            time.sleep(0.05)
            self.poll()
        for job in self.running:
            self._kill(job, f"still running {grace:g} s after the run ended: killed")
        if self.waiting:
            self._failed(f"{len(self.waiting)} event(s) not delivered before the end of the run")
        self.running, self.waiting = [], []

    def _kill(self, job: _Running, why: str) -> None:
        kill_now(job.proc, timeout=1.0)
        job.err.close()
        self._failed(why)

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures == 1:
            try:
                self.on_failure(why)
            except Exception:
                pass


def _first_line(handle) -> str:
    try:
        handle.seek(0)
        lines = [x.strip() for x in handle.read(4096).decode("utf-8", "replace").splitlines() if x.strip()]
    except (OSError, ValueError):
        return ""
    return f": {lines[0][:200]}" if lines else ""
