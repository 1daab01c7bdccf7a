"""More than one machine: the nodes of a run, the round they agree on, and a node that stopped for good.

On more than one machine each node's DDP launcher starts its ranks with torch's c10d rendezvous
(:mod:`rocm_yolo.ddp.rendezvous`), and :class:`Nodes` (in the spec) says how many nodes there are,
which one this is (rocm-yolo's own node id: the rendezvous assigns torch's group ranks in an order of
its own), where they meet and in which **round**. A round is one meeting of every node at the
rendezvous: the nodes meet again in a new round after any failure. :class:`Round`
(``RUN/rocm_yolo/round.json``, on the storage every node sees) is the round every node agrees on and
the loader profile it trains on: :func:`join_round` gives a node the round the others wait in, or opens
the next one; :func:`mark_round_started` closes it to latecomers once its ranks run. A node that stops
for good (an internal error, a broken environment, a verdict: no restart of its own) says so in the
round (:class:`NodeStop`, :func:`record_stop`): the other nodes stop too, with its exit code, at their
next restart or while they wait at the rendezvous, instead of waiting there for it until
``--rdzv-timeout``. A user's start or resume opens a round without it. Where no one gave the rendezvous a port
(no ``--rdzv-endpoint``, no ``MASTER_PORT``: a SLURM job, say), the run draws its own once, at random, and keeps it
in ``round.json`` for every round (:attr:`Round.port`): a port derived from the job id alone would be anyone's
to guess and take first.

Each node's supervisor says it lives (:class:`SayAlive`: ``node-K/alive.json``, a count raised every
few seconds); after a failed attempt, a node whose count stopped (:func:`lost_nodes`) is gone, and the
others meet again without it (``--nnodes MIN:MAX``) or wait for it at the rendezvous, spending no restart.

The supervisor (a restart joins the next round) and the DDP launcher (it watches for a node's stop)
share this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import threading
from dataclasses import asdict, dataclass, fields, replace
from typing import Mapping

from rocm_yolo.run.atomic import PRIVATE_FILE, open_no_link, private_dir, write_atomic
from rocm_yolo.run.paths import RunPaths


@dataclass(frozen=True)
class Nodes:
    """The machines of a multi-node run, as one node's spec says them."""

    count: int  # how many nodes (--nnodes, SLURM_NNODES)
    node: int  # rocm-yolo's id of this node, 0..count-1 (--node-rank, SLURM_NODEID): its files are node-K/
    endpoint: str  # HOST:PORT of torch's c10d rendezvous (--rdzv-endpoint; SLURM: the first host, the run's port)
    # seconds to wait for the other nodes there (--rdzv-timeout; a record made or read without one: its default)
    timeout: float = 600.0
    source: str = "flags"  # where the job came from, for the header: flags, SLURM
    round: int = 1  # the round of the rendezvous this attempt joins (:class:`Round`)
    own_port: bool = False  # no port given (flags, MASTER_PORT): the run's own, drawn once (:attr:`Round.port`)
    minimum: int | None = None  # --nnodes MIN:MAX: the run goes on with at least MIN of its ``count`` nodes

    @property
    def host(self) -> bool:
        """Whether this node hosts the rendezvous' store (node 0; the endpoint names its machine): the others only
        connect, so a port someone else holds is an error, never a store of theirs."""
        return self.node == 0

    def at_port(self, port: int) -> "Nodes":
        return replace(self, endpoint=f"{self.endpoint.rpartition(':')[0]}:{port}")

    @property
    def elastic(self) -> bool:
        return self.minimum is not None and self.minimum < self.count

    @property
    def counts(self) -> range:
        """How many nodes a round may have: ``count``, or any from ``minimum`` to it."""
        return range(self.minimum if self.elastic else self.count, self.count + 1)

    @property
    def nnodes(self) -> str:
        """As torch's launcher and ``--nnodes`` write it: ``N``, or ``MIN:MAX``."""
        return f"{self.minimum}:{self.count}" if self.elastic else str(self.count)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Nodes":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> str:
        going_on = f" (going on with {self.minimum} or more)" if self.elastic else ""
        return (
            f"node {self.node} of {self.count}{going_on}, rendezvous {self.endpoint} ({self.source}), "
            f"round {self.round}"
        )


@dataclass(frozen=True)
class NodeStop:
    """A node that stopped for good, and why: every node of the run stops with its exit code."""

    node: int
    exit_code: int
    reason: str  # one line: "internal error: KeyError: ..."

    @classmethod
    def from_dict(cls, data: Mapping) -> "NodeStop":
        return cls(int(data["node"]), int(data["exit_code"]), str(data["reason"]))

    def describe(self, count: int) -> str:
        return f"node {self.node} of {count} stopped for good (exit {self.exit_code}: {self.reason})"


@dataclass(frozen=True)
class Round:
    """A meeting of every node at the rendezvous, and the loader profile its ranks train on."""

    number: int
    profile: str
    started: bool = False  # its ranks run: a node that comes later meets the others in the next round
    stopped: NodeStop | None = None  # a node stopped for good: no node meets the others again
    port: int | None = None  # the run's own rendezvous port where no one gave one, the same in every round


OWN_PORTS = range(15000, 30000)  # below Linux's ephemeral range (32768-60999)


def draw_port() -> int:
    """A rendezvous port of the run's own: drawn at random, kept in ``round.json`` (in the user's private folder),
    so that no one can tell it from what is public about the job (SLURM's job id)."""
    return random.SystemRandom().choice(OWN_PORTS)


def read_round(paths: RunPaths) -> Round | None:
    """The round every node agrees on, as ``round.json`` says it; None when missing or unreadable."""
    try:
        data = json.loads(paths.round.read_text())
        stopped = NodeStop.from_dict(data["stopped"]) if data.get("stopped") else None
        port = int(data["port"]) if data.get("port") else None
        found = Round(int(data["number"]), str(data["profile"]), bool(data.get("started", False)), stopped, port)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return found if found.number >= 1 else None


class _RoundLock:
    """``round.lock`` held (flock): one node at a time reads and moves the round."""

    def __init__(self, paths: RunPaths):
        self.paths = paths

    def __enter__(self) -> "_RoundLock":
        private_dir(self.paths.state)
        self.fd = open_no_link(self.paths.round_lock, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:  # storage without locks (Lustre without -o flock): the writes are atomic all the same
            pass
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def join_round(paths: RunPaths, profile: str, after: int | None = None, own_port: bool = False) -> Round:
    """The round this node joins: the one the other nodes wait in (opened, not started, later than ``after``),
    else a new one after every round so far, on ``profile``. ``after``: the round this node's last attempt
    failed in (a watchdog restart), None for a first attempt or a user's resume. A watchdog restart after a node
    stopped for good gets that round, ``stopped`` and all (the caller stops); a user's start opens a new one.
    A new round keeps the run's port (:attr:`Round.port`); the first one draws it when ``own_port`` asks for one."""
    with _RoundLock(paths):
        found = read_round(paths)
        if found is not None and found.stopped is not None:
            if after is not None:
                return found
        elif found is not None and not found.started and found.number > (after or 0):
            return found
        port = found.port if found is not None and found.port else draw_port() if own_port else None
        opened = Round(max(found.number if found else 0, after or 0) + 1, profile, port=port)
        write_atomic(paths.round, json.dumps(asdict(opened)))
        return opened


def mark_round_started(paths: RunPaths, number: int) -> None:
    """Round ``number``'s ranks run: a node that joins now opens the next round instead."""
    with _RoundLock(paths):
        found = read_round(paths)
        if found is not None and found.number == number and not found.started:
            write_atomic(paths.round, json.dumps(asdict(replace(found, started=True))))


def record_stop(paths: RunPaths, stop: NodeStop, round_number: int, profile: str) -> NodeStop:
    """Node ``stop.node`` stops for good, in round ``round_number`` (on ``profile``): every node stops. The stop
    that was there first, if any, stays (a node that stops because another did says nothing new); the one kept."""
    with _RoundLock(paths):
        found = read_round(paths)
        if found is not None and found.stopped is not None:
            return found.stopped
        base = found or Round(round_number, profile, started=True)
        write_atomic(paths.round, json.dumps(asdict(replace(base, stopped=stop))))
        return stop


def stopped_node(paths: RunPaths) -> NodeStop | None:
    """The node that stopped the run for good, as ``round.json`` says, if one did."""
    found = read_round(paths)
    return found.stopped if found is not None else None


# --------------------------------------------------------------------------- a node's supervisor lives

ALIVE_EVERY = 2.0  # seconds between rewrites of a node's alive.json by its supervisor
LOST_AFTER = 15.0  # seconds without a rewrite after which a node is gone (its supervisor, or its machine)


def say_alive(paths: RunPaths, beat: int) -> None:
    """This node's supervisor lives: ``node-K/alive.json`` holds a count it raises every :data:`ALIVE_EVERY`."""
    paths.node_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(paths.alive, json.dumps({"beat": beat, "pid": os.getpid()}))


def alive_beat(paths: RunPaths) -> int | None:
    try:
        return int(json.loads(paths.alive.read_text())["beat"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


FOLLOW_WITHIN = 10.0  # seconds a node whose ranks failed waits for another to open the next round first


def later_round(paths: RunPaths, nodes: Nodes, clock, sleep, wait: float = FOLLOW_WITHIN) -> int | None:
    """A later round than this node's that another node opened, not started yet, within ``wait`` seconds: that node
    restarted first (its own failure made this node's ranks fail: they wait in its collectives), and this one
    follows it. None when no node opened one meanwhile."""
    deadline = clock() + wait
    while True:
        found = read_round(paths)
        if found is not None and found.number > nodes.round and not found.started and found.stopped is None:
            return found.number
        if clock() >= deadline:
            return None
        sleep(0.5)


def lost_nodes(paths: RunPaths, nodes: Nodes, clock, sleep, wait: float = LOST_AFTER) -> list[int]:
    """The other nodes whose supervisor did not raise its count within ``wait`` seconds of this one's clock (no
    other clock is read: the storage's times and the machines' may differ): gone, or cut off from the storage."""
    others = [k for k in range(nodes.count) if k != nodes.node]
    first = {k: alive_beat(paths.for_node(k)) for k in others}
    deadline = clock() + wait
    while True:
        silent = [k for k in others if alive_beat(paths.for_node(k)) in (first[k], None)]
        if not silent or clock() >= deadline:
            return silent
        sleep(0.5)


class SayAlive:
    """A thread of a node's supervisor that raises its count in ``alive.json`` every :data:`ALIVE_EVERY` seconds,
    whatever the supervisor does meanwhile (a kill, a stack dump): the other nodes tell a node that is gone from
    one that is busy (:func:`lost_nodes`)."""

    def __init__(self, paths: RunPaths, every: float = ALIVE_EVERY):
        self.paths, self.every = paths, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rocm-yolo-alive", daemon=True)

    def start(self) -> "SayAlive":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            try:
                say_alive(self.paths, beat)
            except OSError:
                pass  # the storage refuses for now: the other nodes may call this one gone, and it rejoins
            self._stop.wait(self.every)
