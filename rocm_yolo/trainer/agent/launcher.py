"""More than one GPU: the training child launches one rank per GPU with ``torch.distributed.run``.

With ``--device 0,1`` the training child does not train. It starts Ultralytics' launcher as
Ultralytics does: ``python -m torch.distributed.run --nproc_per_node N --master_port P``. Each
rank it starts is a training child of its own (``-m rocm_yolo.trainer SPEC.json``), with the
same set-up as a single-GPU run: the profile's environment and presets, its own fork server,
the DataLoader and Conv2d patches, the heartbeat and mid-epoch checkpoints. Ultralytics' own
launch would need none of this and would delete the run directory first
(``generate_ddp_command``). The ranks then train with Ultralytics' DDP code: ``_setup_ddp``,
``DistributedSampler``, the all-reduce.

The launcher stays between the supervisor and ``torch.distributed.run``:

- **heartbeats**: the ranks cannot inherit the supervisor's pipe, because the launcher of
  ``torch.distributed.run`` closes every inherited file descriptor. Each rank writes its
  records into a FIFO instead (:data:`rocm_yolo.environment.HEARTBEAT_FIFO`), and a relay thread here copies them, whole
  lines, into the pipe. A rank's last line says its exit code (:func:`rocm_yolo.run.heartbeat.exit_line`): kept here
  for the outcome, and relayed, so that the supervisor takes the time the ranks and torch's agent need to go
  (a crash's teardown, the wait for the other nodes) for an end, not a hang.
- **exit codes**: ``torch.distributed.run`` reports any failure as 1 (and its own reports go
  to ``RUN/rocm_yolo/torchrun.log``, not the terminal: :mod:`.torchrun`). The launcher returns
  what the ranks said: a user error, a finished run, a broken environment, an internal error
  or a crash (1). :func:`outcome` decides.
- **stopping**: SIGTERM is forwarded to ``torch.distributed.run``, which stops its ranks. The
  launcher dies with the supervisor, and ``torch.distributed.run`` dies with the launcher
  (``PR_SET_PDEATHSIG``), and each rank dies with it. A SIGKILL anywhere leaves no rank running.
- **more than one machine**: the same on each node, with torch's c10d rendezvous instead of
  ``--master_port`` (:mod:`.rendezvous`: the round, the wait, a rendezvous tried again, the nodes
  that did not come, a node that stopped for good: :data:`rocm_yolo.errors.NODES_MISSING`, the run ends).

This module does not import torch.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rocm_yolo import environment, errors
from rocm_yolo.process.lifecycle import pdeathsig_kill
from rocm_yolo.run import heartbeat
from rocm_yolo.run.devices import world_size
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.trainer.agent.rendezvous import Meeting

QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"
# what a rank's exit code says, most telling first: a user error or a finished run is no crash to retry
TELLING = (errors.USAGE, errors.CHILD_FINISHED, errors.SETUP, errors.INTERNAL)


def free_port() -> int:
    """A free TCP port for the ranks' rendezvous, below the ephemeral range as Ultralytics picks it: the
    port is released here and bound again by ``torch.distributed.run``, and an ephemeral one could be handed
    to an outgoing connection in between."""
    for port in random.SystemRandom().sample(range(10000, 32768), 10):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(spec_path: str, ranks: int, port: int, log: str) -> list[str]:
    """Ultralytics' launch (``generate_ddp_command``), each rank a rocm-yolo training child; torch's launcher
    reports into ``log`` (:mod:`.torchrun`)."""
    return [
        sys.executable,
        "-m",
        "rocm_yolo.trainer.agent.torchrun",
        log,
        "--nproc_per_node",
        str(ranks),
        "--master_port",
        str(port),
        "-m",
        "rocm_yolo.trainer",
        spec_path,
    ]


class Relay(threading.Thread):
    """Copies the ranks' lines from the FIFO into the supervisor's pipe; keeps each rank's exit code."""

    def __init__(self, fifo: Path, out_fd: int | None):
        super().__init__(name="rocm-yolo-heartbeat-relay", daemon=True)
        self.fifo = fifo
        self.read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.keep_open = os.open(fifo, os.O_WRONLY)  # no end-of-file while no rank has opened it yet
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


def outcome(launcher_code: int, exits: dict[int, int], ranks: int = 0) -> int:
    """The run's exit code from ``torch.distributed.run``'s (0 only when every rank exited 0) and the ranks' own:
    the ``ranks`` of this node that all ended their training are a success, whatever torch's launcher says (on
    several machines the agent that did not host the store may exit 1 at the end)."""
    if launcher_code == 0 or (ranks and len(exits) >= ranks and all(c == errors.OK for c in exits.values())):
        return errors.OK
    for telling in TELLING:  # what a rank said, then what the launcher itself said (a broken torch)
        if telling in exits.values() or telling == launcher_code:
            return telling
    return errors.FAILED  # a crash: the supervisor restarts it


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


def launch(spec: RunSpec, spec_path: str, log: RunLog) -> int:
    """Start one rank per GPU (of this node) and wait for them; the exit code the supervisor acts on."""
    ranks = world_size(spec.train_args)
    fifo, tmp = make_fifo(spec.paths)
    out_fd = os.environ.get(environment.HEARTBEAT_FD)
    relay = Relay(fifo, int(out_fd) if out_fd and out_fd.isdigit() else None)
    env = {k: v for k, v in os.environ.items() if k != environment.HEARTBEAT_FD}
    env[environment.HEARTBEAT_FIFO] = str(fifo)
    # A rank killed by the watchdog leaves its semaphores to multiprocessing's resource tracker, whose warning
    # about them would reach the terminal: the run says what happened in rocm-yolo's own lines.
    env["PYTHONWARNINGS"] = ",".join(x for x in (os.environ.get("PYTHONWARNINGS"), QUIET_TRACKER) if x)
    torch_log = str(spec.paths.torchrun_log)
    meeting = Meeting(spec, log) if spec.nodes is not None else None
    if meeting is not None:
        env[environment.SHARE_RDZV_STORE_OFF] = "1"  # pytorch#135712: restarts after a re-rendezvous hang
        log.event("ddp_launch", meeting.describe(ranks), ranks=ranks, round=spec.nodes.round)

        def start() -> subprocess.Popen:
            return subprocess.Popen(meeting.command(spec_path, ranks, torch_log), env=env, preexec_fn=pdeathsig_kill)
    else:
        port = free_port()
        log.event(
            "ddp_launch",
            f"{ranks} ranks, one per GPU of --device {spec.train_args.get('device')}: torch.distributed.run "
            f"--nproc_per_node {ranks} --master_port {port}",
            ranks=ranks,
            port=port,
        )

        def start() -> subprocess.Popen:
            return subprocess.Popen(command(spec_path, ranks, port, torch_log), env=env, preexec_fn=pdeathsig_kill)

    try:  # started before the relay's thread: a fork with a second thread running is unsafe with preexec_fn
        proc = start()
    except BaseException:
        relay.stop()
        _remove(fifo, tmp)
        raise
    relay.start()
    try:
        code, stopped = _wait(proc, start, relay, meeting)
    finally:
        relay.stop()
        _remove(fifo, tmp)
    if stopped:
        return 128 + stopped
    if meeting is not None and meeting.halted is not None:  # another node stopped for good: its supervisor says so
        return errors.NODES_MISSING
    if meeting is not None and meeting.missed(code, relay.heard):
        return meeting.give_up()
    return outcome(code, relay.exits, ranks)


def _wait(proc: subprocess.Popen, start, relay: Relay, meeting: Meeting | None) -> tuple[int, int | None]:
    """Wait for torch's launcher (on several machines, start it again while the rendezvous fails before any rank
    of this node ran); its exit code, and the signal that stopped the run, if one did."""
    current, stopped = [proc], []

    def forward(signum, frame):  # the supervisor stops the run: torch.distributed.run stops its ranks
        stopped.append(signum)
        relay.forget_path()  # no rank starts any more: the FIFO's name goes now, its open ends keep working
        try:
            current[0].send_signal(signal.SIGTERM)
        except OSError:
            pass

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            code = current[0].wait() if meeting is None else meeting.wait(current[0], lambda: relay.heard)
            if stopped or meeting is None or not meeting.again(code, relay.heard) or stopped:
                return code, (stopped[0] if stopped else None)
            current[0] = start()  # the relay's thread sits in a read of the FIFO: no lock of ours held over the fork
            if stopped:  # the stop came while it started
                current[0].send_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _remove(fifo: Path, tmp: Path | None) -> None:
    fifo.unlink(missing_ok=True)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
