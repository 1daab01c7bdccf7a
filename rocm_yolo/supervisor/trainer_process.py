"""The supervisor's handle on the training process: the :class:`Child` protocol, and the real one.

:class:`TrainerProcess` (``python -m rocm_yolo.trainer SPEC.json`` in its own session, with its
heartbeat pipe; on several GPUs or machines the DDP launcher, ``python -m rocm_yolo.ddp SPEC.json``,
whose ranks send the heartbeats) is the mechanism behind :class:`rocm_yolo.supervisor.loop.Supervisor`'s policy;
tests drive the loop with scripted children that keep the same :class:`Child` protocol
(``tests/fakes.py``), as torch elastic tests its agent.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol

from rocm_yolo import environment
from rocm_yolo.process import kernel_view, tree
from rocm_yolo.process.kernel_view import ProcessMove, ThreadView
from rocm_yolo.process.output import stderr_sink
from rocm_yolo.process.tee import Tee
from rocm_yolo.run import heartbeat
from rocm_yolo.run.devices import launches_ranks, world_size
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.supervisor.config import WatchdogConfig

TRAINER_MODULE = "rocm_yolo.trainer"  # the training child, on one GPU
DDP_MODULE = "rocm_yolo.ddp"  # on several GPUs or machines: the DDP launcher, which starts the ranks (no torch)


class Child(Protocol):
    """One attempt's training process, as the supervisor's loop sees it."""

    pid: int
    ranks: dict[int, Heartbeat]  # each rank's newest heartbeat (one entry on one GPU)
    exits: dict[int, int]  # on several GPUs, the exit code each rank said it ends with, so far
    rank_count: int  # the ranks it runs (1 on one GPU)

    def poll(self) -> int | None:
        """Its exit code once it has exited, else None."""

    def heartbeats(self) -> list[Heartbeat]:
        """Its heartbeats since the last call, oldest first."""

    def dump_stacks(self, out: Path) -> Path:
        """Write the Python stacks of its whole tree into ``out``; bounded in time."""

    def pids(self) -> list[int]:
        """The pids of its whole tree now (before a kill: the KFD lists them until the GPU lets them go)."""

    def stderr_mark(self, at: float) -> int:
        """Where its stderr stood at wall-clock time ``at`` (:meth:`stderr_tail` splits there)."""

    def stderr_tail(self, since: int | None = None) -> tuple[str, str]:
        """The newest part of what its tree wrote to stderr (copied to the terminal already), split at the mark
        ``since``: (what came before it, what came after); all of it after for None."""

    def blocked_on_terminal(self) -> int | None:
        """A process of its tree that waits for its terminal to take its output (a pid), or None."""

    def threads(self) -> tuple[ThreadView, ...]:
        """The kernel's view of each thread of its tree now: state, wchan, system call (a hang's evidence)."""

    def movement(self) -> dict[int, ProcessMove] | None:
        """Each process of its tree: state, CPU time, I/O bytes now; None when it cannot be read (no /proc)."""

    def kill(self) -> list[int]:
        """Stop its whole tree; the pids still alive after SIGKILL."""

    def pause(self) -> None:
        """Stop (SIGSTOP) its whole tree."""

    def unpause(self) -> None:
        """Continue (SIGCONT) its whole tree."""


class PipeReader:
    """The supervisor's end of the heartbeat pipe: the complete records written since the last read, without blocking.

    Every record counts, not only the newest: the first batch after a resume, say, tells where
    the attempt started, and a short rest of an epoch can be trained between two reads.
    """

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self.pending = b""
        self.last: Heartbeat | None = None  # the newest record: what a position line moves on
        self.exits: dict[int, int] = {}  # on several GPUs: each rank's exit line, relayed by the launcher

    def read(self) -> list[Heartbeat]:
        while self.fd >= 0:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:  # the child closed its end (exited)
                self.close()
                break
            self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        beats = []
        for line in lines:
            text = line.decode("utf-8", "replace")
            if text.startswith(heartbeat.EXIT_PREFIX):  # a rank ends: its tree goes soon (the launcher's outcome)
                found = heartbeat.parse_exit(text)
                if found is not None:
                    self.exits[found[0]] = found[1]
                continue
            if text.startswith(heartbeat.POSITION_PREFIX):  # a batch finished between two records: rank 0's, moved on
                hb = heartbeat.apply_position(self.last, text) if self.last is not None else None
            else:
                hb = heartbeat.parse(text)
            if hb is not None:
                beats.append(hb)
                if hb.lead:  # only local rank 0 sends position lines (the other ranks of a multi-GPU run do not)
                    self.last = hb
        return beats

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class TrainerProcess:
    """The training child in its own session.

    It dies with the supervisor (``PR_SET_PDEATHSIG``) and sends its heartbeat down a pipe,
    so a disk too full for the heartbeat file is not taken for a hang. Its stderr is a second pipe, copied to
    the terminal as it comes and kept (:class:`~rocm_yolo.process.tee.Tee`): the GPU runtime's last words.
    """

    def __init__(self, spec: RunSpec, config: WatchdogConfig):
        self.spec = spec
        self.config = config
        spec_path = spec.save()  # OSError (disk full, read-only): the caller stops the run
        env = dict(os.environ)
        env[environment.SUPERVISOR_PID] = str(os.getpid())
        if spec.node is not None:  # more than one machine: every process of the tree writes into the node's folder
            env[environment.NODE] = str(spec.node)
        # on several GPUs the supervisor starts the DDP launcher, whose ranks send the beats (their pids are theirs)
        self.multi_gpu = launches_ranks(spec.train_args, spec.nodes)
        module = DDP_MODULE if self.multi_gpu else TRAINER_MODULE
        read_end, write_end = os.pipe()
        err_read, err_write = os.pipe()
        env[environment.HEARTBEAT_FD] = str(write_end)
        try:
            self.proc = tree.start(
                tree.python("-m", module, str(spec_path)), env=env, pass_fds=(write_end,), stderr=err_write
            )
        except BaseException:
            os.close(read_end)
            os.close(err_read)
            raise
        finally:
            os.close(write_end)
            os.close(err_write)
        self.pid = self.proc.pid
        self.tree = tree.Tree(self.proc)  # its number is a root only until the kill reaps it
        self.beats = PipeReader(read_end)
        self.stderr = Tee(err_read, _stderr_sink(), spec.paths.child_stderr(spec.attempt))
        self.ranks: dict[int, Heartbeat] = {}  # each rank's newest record
        self.exits = self.beats.exits
        self.rank_count = world_size(spec.train_args) if self.multi_gpu else 1

    def poll(self) -> int | None:
        return self.tree.exited()  # not reaped: only the kill reaps it, after its last look at the session

    def heartbeats(self) -> list[Heartbeat]:
        """This child's heartbeats (on several GPUs, its ranks') since the last call, oldest first."""
        beats = [hb for hb in self.beats.read() if self.multi_gpu or hb.pid == self.pid]
        for hb in beats:
            self.ranks[hb.rank] = hb
        return beats

    def dump_stacks(self, out: Path) -> Path:
        return tree.dump_stacks(self.pid, self.spec.paths.stacks, out, procs=self.tree.members())

    def pids(self) -> list[int]:
        return [p.pid for p in self.tree.members()]

    def stderr_mark(self, at: float) -> int:
        return self.stderr.mark(at)

    def stderr_tail(self, since: int | None = None) -> tuple[str, str]:
        self.stderr.drain()
        return self.stderr.tail(since)

    def blocked_on_terminal(self) -> int | None:
        return tree.blocked_on_terminal(self.tree.members())

    def threads(self) -> tuple[ThreadView, ...]:
        stacks = self.spec.paths.stacks
        roles = {p: "trainer" if p == self.pid else tree.role_of(stacks, p) for p in self.pids()}
        return kernel_view.threads(list(roles), roles, self.config.proc_root)

    def movement(self) -> dict[int, ProcessMove] | None:
        found = kernel_view.movement(self.pids(), self.config.proc_root)
        return found or None  # not even the trainer's own files: nothing to judge movement by

    def kill(self) -> list[int]:
        left = tree.kill(self.tree, self.config.term_timeout, self.config.kill_timeout)  # and reaps it
        self.beats.close()
        if self.multi_gpu and not left:  # a launcher killed in its cleanup leaves its FIFO: the tree is gone
            self.spec.paths.ranks_fifo.unlink(missing_ok=True)
        return left

    def pause(self) -> None:
        tree.send(self.tree.members(), signal.SIGSTOP)

    def unpause(self) -> None:
        tree.send(self.tree.members(), signal.SIGCONT)


def _stderr_sink():
    """Where the child's stderr is shown: where this process's ``sys.stderr`` goes (a Jupyter kernel's cell, or the
    terminal on fd 2, never blocking on it: :func:`rocm_yolo.process.output.stderr_sink`)."""
    return stderr_sink()
