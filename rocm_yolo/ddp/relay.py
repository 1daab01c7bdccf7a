"""The ranks' heartbeats, relayed: their FIFO, and the thread that copies their lines into the supervisor's pipe.

The ranks cannot inherit the supervisor's pipe, because the launcher of ``torch.distributed.run``
closes every inherited file descriptor. Each rank writes its records into a FIFO instead
(:data:`rocm_yolo.environment.HEARTBEAT_FIFO`, opened by :func:`rocm_yolo.trainer.rank.reporting`),
and :class:`Relay` copies them, whole lines, into the pipe. A rank's last line says its exit code
(:func:`rocm_yolo.run.heartbeat.exit_line`): kept here for the outcome, and relayed, so that the
supervisor takes the time the ranks and torch's agent need to go (a crash's teardown, the wait for the
other nodes) for an end, not a hang.

This module does not import torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

from rocm_yolo.run import heartbeat
from rocm_yolo.run.paths import RunPaths


class Relay(threading.Thread):
    """Copies the ranks' lines from the FIFO into the supervisor's pipe; keeps each rank's exit code."""

    def __init__(self, fifo: Path, out_fd: int | None):
        super().__init__(name="rocm-yolo-heartbeat-relay", daemon=True)
        self.fifo = fifo
        self.read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        self.keep_open = os.open(fifo, os.O_WRONLY | os.O_NOFOLLOW)  # no end-of-file while no rank has opened it yet
        os.set_blocking(self.read_fd, True)
        if out_fd is not None:
            os.set_blocking(out_fd, False)  # a supervisor that stops reading (Ctrl-Z) never stalls the relay
        self.out_fd = out_fd
        self.exits: dict[int, int] = {}
        self.heard = False  # a rank of this node has started (on several machines: the nodes met)
        self.pending = b""

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                self._handle(line)

    def _handle(self, line: bytes) -> None:
        self.heard = True
        text = line.decode("utf-8", "replace")
        if text.startswith(heartbeat.START_PREFIX):
            return
        if text.startswith(heartbeat.EXIT_PREFIX):  # kept for the outcome, and relayed: the tree goes soon
            found = heartbeat.parse_exit(text)
            if found is not None:
                self.exits[found[0]] = found[1]
        if self.out_fd is not None:
            try:
                os.write(self.out_fd, line + b"\n")
            except BlockingIOError:
                pass  # a full pipe: drop the line rather than stall a rank (as the rank itself would)
            except OSError:
                self.out_fd = None  # the supervisor is gone

    def forget_path(self) -> None:
        self.fifo.unlink(missing_ok=True)

    def stop(self) -> None:
        """After the ranks are gone: the FIFO ends, the thread reads what is left and stops."""
        os.close(self.keep_open)
        if self.ident is not None:
            self.join(timeout=5)
        if not self.is_alive():
            os.close(self.read_fd)


def make_fifo(paths: RunPaths) -> tuple[Path, Path | None]:
    """The ranks' FIFO, in the run's state directory (a stale one of a killed launcher is replaced); where
    that file system has no FIFOs, in a temporary directory (returned too, to remove)."""
    try:
        paths.ranks_fifo.unlink(missing_ok=True)
        os.mkfifo(paths.ranks_fifo, 0o600)
        return paths.ranks_fifo, None
    except OSError:
        tmp = Path(tempfile.mkdtemp(prefix="rocm-yolo-ranks-"))
        os.mkfifo(tmp / "heartbeat", 0o600)
        return tmp / "heartbeat", tmp


def remove_fifo(fifo: Path, tmp: Path | None) -> None:
    fifo.unlink(missing_ok=True)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
