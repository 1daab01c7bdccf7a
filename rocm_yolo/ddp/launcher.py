"""The DDP launcher: ``python -m rocm_yolo.ddp SPEC.json`` launches one rank per GPU with ``torch.distributed.run``.

With ``--device 0,1`` (or on several machines) the supervisor starts this process instead of the
training child (:func:`rocm_yolo.run.devices.launches_ranks`). It does not train: it starts
Ultralytics' launcher as Ultralytics does, ``python -m torch.distributed.run --nproc_per_node N
--master_port P``. Each rank it starts is a training child of its own (``-m rocm_yolo.trainer
SPEC.json``), with the same set-up as a single-GPU run: the profile's environment and presets, its own
fork server, the DataLoader and Conv2d patches, the heartbeat and mid-epoch checkpoints (what differs
in a rank: :mod:`rocm_yolo.trainer.rank`). Ultralytics' own launch would need none of this and would
delete the run directory first (``generate_ddp_command``). The ranks then train with Ultralytics' DDP
code: ``_setup_ddp``, ``DistributedSampler``, the all-reduce.

The launcher stays between the supervisor and ``torch.distributed.run``:

- **heartbeats**: the ranks write into a FIFO, and a thread here relays their lines into the
  supervisor's pipe (:mod:`.relay`); a rank's last line says its exit code.
- **exit codes**: ``torch.distributed.run`` reports any failure as 1 (and its own reports go
  to ``RUN/rocm_yolo/torchrun.log``, not the terminal: :mod:`.torchrun`). The launcher returns
  what the ranks said: a user error, a finished run, a broken environment, an internal error
  or a crash (1). :func:`outcome` decides.
- **stopping**: the first SIGTERM is forwarded to ``torch.distributed.run``, which stops its ranks (a second one
  would cut its wait for them short: SLURM's ``scancel`` signals every process of the step, this one too). The
  launcher dies with the supervisor, and ``torch.distributed.run`` dies with the launcher
  (``PR_SET_PDEATHSIG``), and each rank dies with it. A SIGKILL anywhere leaves no rank running.
- **more than one machine**: the same on each node, with torch's c10d rendezvous instead of
  ``--master_port`` (:mod:`.rendezvous`: the round, the wait, a rendezvous tried again, the nodes
  that did not come, a node that stopped for good: :data:`rocm_yolo.errors.NODES_MISSING`, the run ends).

This module does not import torch. As the training child's, its stacks go to ``RUN/stacks/trainer-PID.txt``
when the watchdog asks, and a failure before the ranks start is one line and an exit code
(:func:`rocm_yolo.setup_failure.report_setup_failure`).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys

from rocm_yolo import environment, errors
from rocm_yolo.ddp.relay import Relay, make_fifo, remove_fifo
from rocm_yolo.ddp.rendezvous import NodeRendezvous
from rocm_yolo.process.lifecycle import die_with_parent, dump_stacks_into, pdeathsig_kill
from rocm_yolo.process.output import RunLog
from rocm_yolo.process.tree import SAFE_PATH, python
from rocm_yolo.run.devices import world_size
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.setup_failure import report_setup_failure

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


SOCKET_IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # gloo's and NCCL/RCCL's: the interface they use


def loopback_only(env: dict) -> dict[str, str]:
    """On one machine: gloo and NCCL/RCCL bind the loopback interface, where nothing outside the machine reaches
    them, unless the user named an interface for either (then both are left alone)."""
    if any(env.get(name) for name in SOCKET_IFNAMES):
        return {}
    return dict.fromkeys(SOCKET_IFNAMES, loopback_interface())


def loopback_interface() -> str:
    """The name of the interface of 127.0.0.1 (``lo`` on Linux)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
                return name
    except Exception:  # noqa: BLE001 - no interface list: Linux's name
        pass
    return "lo"


def command(spec_path: str, ranks: int, port: int, log: str) -> list[str]:
    """Ultralytics' launch (``generate_ddp_command``), each rank a rocm-yolo training child; torch's launcher
    reports into ``log`` (:mod:`.torchrun`)."""
    return [
        *python("-m", "rocm_yolo.ddp.torchrun"),
        log,
        "--nproc_per_node",
        str(ranks),
        "--master_port",
        str(port),
        "-m",
        "rocm_yolo.trainer",
        spec_path,
    ]


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


def launch(spec: RunSpec, spec_path: str, log: RunLog) -> int:
    """Start one rank per GPU (of this node) and wait for them; the exit code the supervisor acts on."""
    ranks = world_size(spec.train_args)
    fifo, tmp = make_fifo(spec.paths)
    out_fd = os.environ.get(environment.HEARTBEAT_FD)
    relay = Relay(fifo, int(out_fd) if out_fd and out_fd.isdigit() else None)
    env = {k: v for k, v in os.environ.items() if k != environment.HEARTBEAT_FD}
    env[environment.HEARTBEAT_FIFO] = str(fifo)
    env[SAFE_PATH] = "1"  # torch's launcher starts each rank as python -u -m: no working directory on its sys.path
    # A rank killed by the watchdog leaves its semaphores to multiprocessing's resource tracker, whose warning
    # about them would reach the terminal: the run says what happened in rocm-yolo's own lines.
    env["PYTHONWARNINGS"] = ",".join(x for x in (os.environ.get("PYTHONWARNINGS"), QUIET_TRACKER) if x)
    torch_log = str(spec.paths.torchrun_log)
    rdzv = NodeRendezvous(spec, log) if spec.nodes is not None else None
    if rdzv is not None:
        env[environment.SHARE_RDZV_STORE_OFF] = "1"  # pytorch#135712: restarts after a re-rendezvous hang
        log.event("ddp_launch", rdzv.describe(ranks), ranks=ranks, round=spec.nodes.round)

        def start() -> subprocess.Popen:
            return subprocess.Popen(rdzv.command(spec_path, ranks, torch_log), env=env, preexec_fn=pdeathsig_kill)
    else:
        env.update(loopback_only(env))  # one machine: the ranks' collectives talk over the loopback interface
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
        remove_fifo(fifo, tmp)
        raise
    relay.start()
    try:
        code, stopped = _wait(proc, start, relay, rdzv)
    finally:
        relay.stop()
        remove_fifo(fifo, tmp)
    if stopped:
        return 128 + stopped
    if rdzv is not None and rdzv.halted is not None:  # another node stopped for good: its supervisor says so
        return errors.NODES_MISSING
    if rdzv is not None and rdzv.regroup is not None:  # a node waits in a later round: meet it there
        return errors.REGROUP
    if rdzv is not None and rdzv.missed(code, relay.heard):
        return rdzv.give_up()
    return outcome(code, relay.exits, ranks)


def _wait(proc: subprocess.Popen, start, relay: Relay, rdzv: NodeRendezvous | None) -> tuple[int, int | None]:
    """Wait for torch's launcher (on several machines, start it again while the rendezvous fails before any rank
    of this node ran); its exit code, and the signal that stopped the run, if one did."""
    current, stopped = [proc], []

    def forward(signum, frame):  # the supervisor stops the run: torch.distributed.run stops its ranks
        stopped.append(signum)
        if len(stopped) > 1:  # once: a second SIGTERM cuts torch's agent's wait for its ranks (and their saves)
            return  # short, and the ranks die with it (SLURM's scancel signals every process of the step)
        relay.forget_path()  # no rank starts any more: the FIFO's name goes now, its open ends keep working
        try:
            current[0].send_signal(signal.SIGTERM)
        except OSError:
            pass

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            code = current[0].wait() if rdzv is None else rdzv.wait(current[0], lambda: relay.heard)
            if stopped or rdzv is None or not rdzv.again(code, relay.heard) or stopped:
                return code, (stopped[0] if stopped else None)
            current[0] = start()  # the relay's thread sits in a read of the FIFO: no lock of ours held over the fork
            if stopped:  # the stop came while it started
                current[0].send_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """``python -m rocm_yolo.ddp SPEC.json``: this node's ranks, started and waited for; the exit code the
    supervisor acts on."""
    argv = sys.argv[1:] if argv is None else argv
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)  # its start_method event says what the ranks' say
    torch_was_imported = "torch" in sys.modules
    try:
        spec = RunSpec.load(argv[0])
    except Exception as e:  # the supervisor wrote it: anything wrong with it is a rocm-yolo bug
        return errors.report_internal(e)
    log = RunLog(spec.paths.log, spec.paths.events, rank=None)
    log.event("start_method", method=multiprocessing.get_start_method(), torch_imported=torch_was_imported)
    die_with_parent(int(os.environ.get(environment.SUPERVISOR_PID, "0") or 0))  # no orphan if the supervisor is killed
    try:
        dump_stacks_into(spec.paths, spec.paths.trainer_stacks(os.getpid()))
    except (OSError, errors.UsageError) as e:
        return report_setup_failure(spec, log, e)
    try:
        return launch(spec, argv[0], log)  # one rank per GPU (of each node); this process imports no torch
    except KeyboardInterrupt:
        return errors.INTERRUPTED
    except BaseException as e:  # the launch itself failed (no FIFO, no process): the environment, or a bug
        return report_setup_failure(spec, log, e)
