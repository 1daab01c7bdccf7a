"""More than one machine: the DDP launcher's side of torch's c10d rendezvous (torch-free).

Each node's launcher starts its node's agent, as ``torchrun`` would be started on each machine::

    python -m torch.distributed.run --nnodes N --nproc_per_node n --rdzv-backend c10d
        --rdzv-endpoint HOST:PORT --rdzv-id rocm-yolo-round-R --rdzv-conf join_timeout=T,is_host=H
        --max-restarts 0 -m rocm_yolo.trainer SPEC.json

- **Who hosts the store**: node 0, whose machine the endpoint names (``is_host=1``); every other node only
  connects (``is_host=0``). Left to torch, an agent guesses from the host name, and one that cannot bind the port
  becomes a client of whatever listens there: of a store someone else started, whose contents each agent
  unpickles (c10d keeps the rendezvous' state pickled). So node 0 looks before each start whether the port is
  free on its machine, and a port held by another process ends the run in one line (a setup error, exit 4);
  torch's own bind, should it lose the port in between, fails the rendezvous instead of joining theirs. The port
  gives whoever reaches it code execution in every agent: the nodes must meet on a private network or behind a
  firewall (docs/multi-gpu.md).

- **No restarts of torch's own** (``--max-restarts 0``): the node's supervisor restarts its tree
  after a hang or a crash, as on one machine, and the nodes meet again in the next **round**, the
  same on every node (:func:`rocm_yolo.run.nodes.join_round`). A round has a rendezvous id of its
  own: torch closes a rendezvous for good when an agent ends with a failure.
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the ranks make their own store, not the rendezvous'
  one. With the shared store, restarts after a re-rendezvous hung or failed in 3 of 4 trials here
  (pytorch#135712).
- **The wait** is bounded by ``--rdzv-timeout`` (``--nnodes MIN:MAX``: up to that for MIN nodes, then up to that for
  the others). While no rank of this node runs, the launcher
  rewrites ``node-K/rendezvous.json`` (the round it waits in) every few seconds. A rendezvous that
  fails before any rank runs (the store went away with the agent of an old round that hosted it) is
  tried again in the same round until then. When the time is up, the nodes whose file does not
  show them waiting in this round are the missing ones: :meth:`NodeRendezvous.give_up` names them, and the
  run ends (exit 1).
- **A node that stopped for good** (an internal error, a broken environment: no restart of its own) says so
  in ``round.json`` (:func:`rocm_yolo.run.nodes.record_stop`). The launcher reads it every few seconds while
  torch's launcher runs, waiting at the rendezvous or training: once it is there, this node's agent and ranks
  are stopped (:attr:`NodeRendezvous.halted`), and the node's supervisor stops with that node's exit code.
- **A node that waits in a later round** while this node's ranks train (it came back with ``--resume``, or its
  supervisor restarted its own tree after a failure) makes this node's ranks stop (:attr:`NodeRendezvous.regroup`):
  the launcher exits with :data:`rocm_yolo.errors.REGROUP`, and the node's supervisor meets it there, from the
  run's newest checkpoint, without spending a restart. With ``--nnodes MIN:MAX`` torch's rendezvous waits for the
  missing nodes up to ``--rdzv-timeout`` (its join and last-call timeouts), then goes on with the MIN or more that
  came: the ranks train the run's layout on the GPUs there are (:mod:`rocm_yolo.trainer.midepoch.relayout`).
- **Success is the run's own**: every rank of this node ended its training (exit 0). The agent that
  did not host the store may exit 1 at the end (``DistNetworkError``) although training finished
  (:func:`rocm_yolo.ddp.launcher.outcome`).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from shlex import quote

from rocm_yolo import errors
from rocm_yolo.ddp.torchrun import RENDEZVOUS_FAILED, RENDEZVOUS_TIMEOUT
from rocm_yolo.process.output import RunLog
from rocm_yolo.process.tree import python
from rocm_yolo.run.atomic import private_dirs, write_atomic
from rocm_yolo.run.nodes import NodeStop, read_round, stopped_node
from rocm_yolo.run.spec import RunSpec

MARK_EVERY = 5.0  # seconds between rewrites of node-K/rendezvous.json while this node waits
STALE_AFTER = 30.0  # a node whose file is older than this one's by more than that is not waiting
AGAIN_AFTER = 2.0  # seconds before trying a failed rendezvous again
HALT_GRACE = 40.0  # seconds torch's launcher gets to stop its ranks (it gives them 30) after another node stopped


def port_holder(port: int) -> str | None:
    """What holds TCP ``port`` on this machine so that a store cannot listen on it (binding it on every address, as
    torch's store does): None when it is free."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed store's TIME_WAIT is no holder
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind((address, port))
                return None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "another process listens on it"
            if family == socket.AF_INET6:  # no IPv6 here: as torch, on IPv4
                continue
            return e.strerror or str(e)
    return None


def rendezvous_id(round_number: int) -> str:
    return f"rocm-yolo-round-{round_number}"


class NodeRendezvous:
    """This node's part in one round of the rendezvous, for one attempt of its launcher: torch's launcher for the
    round, the wait (this node's ``rendezvous.json``), a rendezvous tried again, the nodes missing, another node's
    stop."""

    def __init__(self, spec: RunSpec, log: RunLog, clock=time.monotonic):
        self.spec, self.nodes, self.paths, self.log = spec, spec.nodes, spec.paths, log
        self.clock = clock
        # MIN:MAX: torch's rendezvous waits for MIN nodes (its join timeout), then for the rest up to its last call
        # (--rdzv-timeout once MIN are there); the join timeout must outlast the last call, or it fires first
        self.deadline = clock() + self.nodes.timeout * (2 if self.nodes.elastic else 1)
        self.tries = 0
        self.halted: NodeStop | None = None  # another node stopped for good: this node's tree goes
        self.regroup: int | None = None  # a later round a node waits in: this node's ranks stop to meet it
        self._halted_at = 0.0

    def describe(self, ranks: int) -> str:
        n = self.nodes
        return (
            f"node {n.node} of {n.count}, {ranks} ranks: waiting for the other nodes at {n.endpoint} (round "
            f"{n.round}, up to {n.timeout:.0f} s)"
        )

    def command(self, spec_path: str, ranks: int, log_path: str) -> list[str]:
        """torch's launcher for this node, with the time left to wait as the rendezvous' join timeout; on node 0, which
        hosts the store, :class:`~rocm_yolo.errors.SetupError` when another process holds the port."""
        if self.nodes.host:
            self.check_port()
        self.tries += 1
        left = max(int(self.deadline - self.clock() + 0.999), 1)
        return [
            *python("-m", "rocm_yolo.ddp.torchrun"),
            log_path,
            "--nnodes",
            self.nodes.nnodes,
            "--nproc_per_node",
            str(ranks),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.nodes.endpoint,
            "--rdzv-id",
            rendezvous_id(self.nodes.round),
            "--rdzv-conf",
            f"join_timeout={left},is_host={int(self.nodes.host)}"
            + (f",last_call_timeout={int(self.nodes.timeout)}" if self.nodes.elastic else ""),
            "--max-restarts",
            "0",
            "-m",
            "rocm_yolo.trainer",
            spec_path,
        ]

    def check_port(self) -> None:
        """On the node that hosts the store: one line when another process holds the endpoint's port here."""
        port = int(self.nodes.endpoint.rpartition(":")[2])
        holder = port_holder(port)
        if holder is not None:
            raise errors.SetupError(
                f"the rendezvous port {port} is taken on this machine ({holder}): node {self.nodes.node} hosts the "
                f"nodes' rendezvous ({self.nodes.endpoint}) and joins no store of another's; free the port, or give "
                "every node another one (--rdzv-endpoint HOST:PORT or MASTER_PORT)"
            )

    def mark(self) -> None:
        """This node waits in its round: ``node-K/rendezvous.json``, rewritten (its time is the storage's)."""
        record = {"round": self.nodes.round, "endpoint": self.nodes.endpoint, "pid": os.getpid(), "time": time.time()}
        try:
            private_dirs(self.paths.state, self.paths.node_dir)
            write_atomic(self.paths.rendezvous, json.dumps(record))
        except (OSError, errors.UsageError):
            pass  # only the line naming a missing node reads it

    def wait(self, proc: subprocess.Popen, heard) -> int:
        """Wait for torch's launcher to exit, marking this node as waiting while none of its ranks runs; once another
        node stopped for good, or waits in a later round while this node's ranks run, stop it (SIGTERM: it stops its
        ranks; SIGKILL after :data:`HALT_GRACE`)."""
        while True:
            if not heard():
                self.mark()
            self._halt(proc)
            if heard():
                self._regroup(proc)
            try:
                return proc.wait(timeout=MARK_EVERY)
            except subprocess.TimeoutExpired:
                continue

    def _halt(self, proc: subprocess.Popen) -> None:
        if self.halted is not None:
            if self.clock() - self._halted_at > HALT_GRACE:
                proc.kill()
            return
        found = stopped_node(self.paths)
        if found is None or found.node == self.nodes.node:
            return
        self.halted, self._halted_at = found, self.clock()
        self.log.event("node_stop_seen", node=found.node, exit_code=found.exit_code, round=self.nodes.round)
        proc.send_signal(signal.SIGTERM)

    def _regroup(self, proc: subprocess.Popen) -> None:
        """A node opened a later round while this one's ranks train (it came back, or its supervisor restarted its
        own tree): this node's ranks stop, and its supervisor meets it there from the newest checkpoint."""
        if self.regroup is not None or self.halted is not None:
            if self.regroup is not None and self.clock() - self._halted_at > HALT_GRACE:
                proc.kill()
            return
        found = read_round(self.paths)
        if found is None or found.number <= self.nodes.round or found.started or found.stopped is not None:
            return
        self.regroup, self._halted_at = found.number, self.clock()
        self.log.event(
            "regroup",
            f"a node waits in round {found.number} of the rendezvous: this node's ranks stop, to meet it there from "
            "the run's newest checkpoint",
            round=self.nodes.round,
            next_round=found.number,
        )
        proc.send_signal(signal.SIGTERM)

    def again(self, code: int, heard: bool) -> bool:
        """Whether to try the rendezvous again: it failed before any rank of this node ran, with time left."""
        if code != RENDEZVOUS_FAILED or heard or self.halted is not None or self.clock() + AGAIN_AFTER >= self.deadline:
            return False
        self.log.event("rendezvous_again", round=self.nodes.round, tries=self.tries)  # torchrun.log says why
        time.sleep(AGAIN_AFTER)
        return True

    def missed(self, code: int, heard: bool) -> bool:
        """Whether the nodes never met: no rank of this node ran, and the rendezvous failed or timed out."""
        return not heard and code in (RENDEZVOUS_FAILED, RENDEZVOUS_TIMEOUT)

    def missing(self) -> list[int]:
        """The nodes not waiting in this round: no file, another round, or a file not rewritten for a while."""
        try:
            mine = self.paths.rendezvous.stat().st_mtime
        except OSError:
            mine = time.time()
        out = []
        for node in range(self.nodes.count):
            if node == self.nodes.node:
                continue
            path = self.paths.for_node(node).rendezvous
            try:
                found = json.loads(path.read_text()).get("round")
                fresh = path.stat().st_mtime >= mine - STALE_AFTER
            except (OSError, ValueError, AttributeError):
                found, fresh = None, False
            if found != self.nodes.round or not fresh:
                out.append(node)
        return out

    def give_up(self) -> int:
        """The time is up: one line naming the missing nodes; the run ends (exit 1)."""
        n, missing = self.nodes, self.missing()
        run = self.spec.run_dir
        again = f"start every node again with rocm-yolo train --resume {quote(str(run))} and its node flags"
        if missing:
            names = " and ".join(f"node {k}" for k in missing)
            line = (
                f"{names} of {n.count} did not come to the rendezvous at {n.endpoint} within {n.timeout:.0f} s "
                f"(round {n.round}): the run stops here; once {'they are' if len(missing) > 1 else 'it is'} back, "
                f"{again}"
            )
        else:
            line = (
                f"the {n.count} nodes waited at {n.endpoint} but did not meet within {n.timeout:.0f} s (round "
                f"{n.round}; more in {self.paths.torchrun_log}): check that every node reaches that address, "
                f"then {again}"
            )
        self.log.event("nodes_missing", line, missing=missing, round=n.round, endpoint=n.endpoint)
        return errors.NODES_MISSING
