"""Commands started with a tag in their environment: every process they make, orphans included, found and stopped.

A variable every descendant inherits (``ROCM_YOLO_TEST_TAG=<uuid>``, ...) marks a command's
processes: the supervisor, its trainer, the fork server, each DataLoader worker, a rank of
several GPUs. The tests and the benchmarks start rocm-yolo this way, count what is left when it
is done (:meth:`Tagged.leftovers`), and never leave a process behind (:meth:`Tagged.stop`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from typing import Mapping, Sequence

import psutil

from rocm_yolo import environment
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.process.tree import with_env

# Asked of the testing plugin: a run's environment inherits none of them unless the caller gives them.
TESTING_VARIABLES = (environment.FAULT, environment.RECORD_BATCHES, environment.PLUGINS, environment.ANY_PLUGIN)


class Tagged:
    """The processes of commands started with ``var=<a new tag>`` in their environment."""

    def __init__(self, var: str):
        self.var = var
        self.tag = uuid.uuid4().hex

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with the tag, unbuffered output, and ``extra`` (the testing plugin is
        loaded when ``extra`` asks it for a fault or a batch record; no testing variable is inherited)."""
        env = {k: v for k, v in os.environ.items() if k not in TESTING_VARIABLES}
        env.update({self.var: self.tag, "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        if environment.FAULT in env or environment.RECORD_BATCHES in env:
            env.setdefault(environment.PLUGINS, "rocm_yolo.testing")  # the plugin of rocm_yolo.run.hooks
        return env

    def start(
        self, cmd: Sequence[str], *, cwd, output, extra: Mapping[str, str] | None = None, **popen
    ) -> subprocess.Popen:
        """Start ``cmd`` with its output (stdout and stderr) in the open file ``output``: a pipe would stay
        open in orphans and fill up. ``popen``: more of ``subprocess.Popen``'s arguments (``start_new_session``)."""
        return subprocess.Popen(
            list(cmd), cwd=cwd, env=self.environ(extra), stdout=output, stderr=subprocess.STDOUT, **popen
        )

    def processes(self) -> list[psutil.Process]:
        return with_env(self.var, self.tag)

    def leftovers(self, settle: float = 5.0) -> list[psutil.Process]:
        """The tagged processes still alive after up to ``settle`` seconds (not one that exits meanwhile)."""
        deadline = time.monotonic() + settle
        while True:
            left = [p for p in self.processes() if alive(p.pid)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill(self, wait: float = 5.0) -> None:
        """SIGKILL every tagged process, and wait up to ``wait`` seconds for them to go."""
        procs = self.processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=wait)

    def stop(self, proc: subprocess.Popen | None, grace: float = 20.0) -> None:
        """SIGTERM ``proc`` (rocm-yolo's supervisor then stops its own tree) for up to ``grace`` seconds,
        then SIGKILL whatever still carries the tag."""
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
