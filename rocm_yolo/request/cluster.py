"""More than one machine: the nodes of a job, from the node flags or from a scheduler's variables, checked.

Each node runs the same ``rocm-yolo train`` with ``--device`` naming its own GPUs, and the nodes
meet at torch's c10d rendezvous (:mod:`rocm_yolo.ddp.rendezvous`). What forms the job, each value
on its own, the first found:

- the number of nodes: ``--nnodes N``, else the scheduler's (SLURM: ``SLURM_NNODES``); ``--nnodes MIN:MAX``
  (torch's form): MAX nodes, and the run goes on without a node that is lost while MIN or more are left;
- this node's id (rocm-yolo's own, 0..N-1: its files go to ``RUN/rocm_yolo/node-K/``): ``--node-rank K``,
  else the scheduler's (SLURM: ``SLURM_NODEID``);
- where the nodes meet: ``--rdzv-endpoint HOST:PORT``, else ``MASTER_ADDR`` and ``MASTER_PORT`` when set
  (Kubeflow's and most SLURM scripts' variables), else the scheduler's first host (SLURM: of
  ``SLURM_JOB_NODELIST``, expanded without ``scontrol``); for a port not given, the run's own, drawn at random
  when the nodes first meet and kept in the run's private ``round.json`` (``Nodes.own_port``;
  :func:`rocm_yolo.run.nodes.join_round`), never one anyone could derive from the job; torch's
  :data:`DEFAULT_PORT` stands for it until then. The node at the endpoint, which hosts the rendezvous' store, is
  node 0 (SLURM's first host is its node 0);
- how long the nodes wait for each other there: ``--rdzv-timeout`` (its default: :data:`DEFAULT_RENDEZVOUS_TIMEOUT`,
  ``TrainRequest``'s).

Each scheduler's variables are its backend's (:mod:`.schedulers`, SLURM today). One node (no flags
and no scheduler's job of several nodes, or ``--nnodes 1``) is no multi-node job: :func:`resolve`
returns None. Every mistake is a :class:`~rocm_yolo.errors.UsageError` of one line, before anything
starts. Pure logic: it reads the variables it is given and touches nothing.
"""

from __future__ import annotations

import os
from typing import Mapping

from rocm_yolo import environment as env_names
from rocm_yolo.errors import UsageError, option
from rocm_yolo.request.schedulers import SCHEDULERS
from rocm_yolo.request.train_request import TrainRequest
from rocm_yolo.run.nodes import Nodes

DEFAULT_PORT = 29400  # torch's c10d rendezvous port, when a job gives neither a port nor a job id
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_endpoint(text: str, what: str | None = None) -> str:
    """``HOST:PORT`` checked (an IPv6 host in brackets: ``[::1]:29400``); the endpoint as given. ``what``: where it
    came from (variables), else the option."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or host in ("[]",) or not port.isdigit() or not 0 < int(port) < 65536:
        said = f"{what} {text}" if what else option("rdzv_endpoint", text)
        raise UsageError(f"{said}: write HOST:PORT, the address where the nodes meet, e.g. node01:29400")
    return f"{host}:{int(port)}"


def parse_timeout(value: object) -> float:
    """``--rdzv-timeout``: seconds, or a number with s, m or h (``600``, ``10m``, ``1h``)."""
    text = str(value).strip().lower()
    unit = _UNITS.get(text[-1:], None) if text else None
    number = text[:-1] if unit else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(
            f"{option('rdzv_timeout', value)}: give how long the nodes wait for each other, e.g. 600 or 10m"
        )
    return seconds


# Every variable that forms a multi-node job without node flags: MASTER_ADDR and MASTER_PORT, and each scheduler's.
JOB_VARIABLES = (env_names.MASTER_ADDR, env_names.MASTER_PORT, *(v for s in SCHEDULERS for v in s.variables))
# seconds the nodes wait for each other at the rendezvous when --rdzv-timeout is not given: the option's default
DEFAULT_RENDEZVOUS_TIMEOUT = parse_timeout(TrainRequest.default_of("rdzv_timeout"))


def _whole(value: object, name: str) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise UsageError(f"{option(name, value)}: give a whole number")
    return int(str(value).strip())


def _endpoint_from(env: Mapping[str, str]) -> tuple[str | None, str | None, bool]:
    """Where a job's nodes meet by its variables (MASTER_ADDR/MASTER_PORT first, then the schedulers'), the
    scheduler that said any of it (None: none did), and whether the port is the run's own (none was given)."""
    host, port, said = env.get(env_names.MASTER_ADDR), env.get(env_names.MASTER_PORT), None
    for scheduler in SCHEDULERS if not host else ():
        host = scheduler.first_host(env)
        if host:
            said = scheduler.name
            break
    if not host:
        return None, None, False
    where = parse_endpoint(f"{host}:{port or DEFAULT_PORT}", f"{env_names.MASTER_ADDR}:{env_names.MASTER_PORT}")
    return where, said, not port


def _from_schedulers(env: Mapping[str, str], value: str) -> tuple[int | None, str | None]:
    """The job's ``value`` (``nodes`` or ``node``) from the first scheduler whose variables say it, and its name."""
    for scheduler in SCHEDULERS:
        found = getattr(scheduler, value)(env)
        if found is not None:
            return found, scheduler.name
    return None, None


def resolve(
    nnodes: object = None,
    node_rank: object = None,
    endpoint: object = None,
    timeout: object = None,
    env: Mapping[str, str] = os.environ,
) -> Nodes | None:
    """The nodes of the job this node belongs to (None: one machine), from the flags, else the scheduler's
    variables; UsageError for flags that do not form a job."""
    said = []  # the schedulers that said part of the job
    minimum, count = _nnodes(nnodes) if nnodes is not None else (None, None)
    if count is None:
        count, name = _from_schedulers(env, "nodes")
        said += [name] if name else []
    if count is None or count == 1:
        given = [f for f, v in (("node_rank", node_rank), ("rdzv_endpoint", endpoint)) if v is not None]
        if given and count is None:
            raise UsageError(
                f"{option(given[0])} needs {option('nnodes', 'N')} (the number of machines) and the other node options"
            )
        if timeout is not None and count is None:
            raise UsageError(
                f"{option('rdzv_timeout')} is for more than one machine: give {option('nnodes', 'N')} and the other "
                "node options"
            )
        return None
    if count < 1:
        raise UsageError(f"{option('nnodes', count)}: give the number of machines, 1 or more")
    node = _whole(node_rank, "node_rank") if node_rank is not None else None
    if node is None:
        node, name = _from_schedulers(env, "node")
        said += [name] if name else []
    if node is None:
        raise UsageError(
            f"{option('nnodes', count)} needs {option('node_rank', 'K')}, this machine's number from 0 to {count - 1} "
            f"(each node its own), and {option('rdzv_endpoint', 'HOST:PORT')}, where the nodes meet"
        )
    if not 0 <= node < count:
        raise UsageError(
            f"{option('node_rank', node)}: the {count} nodes of {option('nnodes', count)} are numbered 0 to {count - 1}"
        )
    own_port = False
    if endpoint is not None:
        where = parse_endpoint(str(endpoint))
    else:
        where, name, own_port = _endpoint_from(env)
        if where is None:
            raise UsageError(
                f"{option('nnodes', count)} needs {option('rdzv_endpoint', 'HOST:PORT')}: the address where the nodes "
                "meet, one of them (e.g. node01:29400), the same on every node"
            )
        said += [name] if name else []
    seconds = parse_timeout(timeout) if timeout is not None else DEFAULT_RENDEZVOUS_TIMEOUT
    return Nodes(
        count=count,
        node=node,
        endpoint=where,
        timeout=seconds,
        source=said[0] if said else "flags",
        own_port=own_port,
        minimum=minimum if minimum is not None and minimum < count else None,
    )


def _nnodes(value: object) -> tuple[int | None, int]:
    """``--nnodes N`` (a fixed number of machines) or torch's ``MIN:MAX`` (the run goes on with MIN or more):
    ``(MIN or None, MAX)``."""
    low, sep, high = str(value).strip().partition(":")
    if not sep:
        return None, _whole(value, "nnodes")
    if not (low.strip().isdigit() and high.strip().isdigit()) or not 1 <= int(low) <= int(high):
        raise UsageError(
            f"{option('nnodes', value)}: give the number of machines N, or MIN:MAX (the run goes on while at least "
            f"MIN of its MAX nodes are there), e.g. {option('nnodes', '1:2')}"
        )
    return int(low), int(high)
