"""More than one machine: the nodes of a job, from the node flags or from SLURM's variables, checked.

Each node runs the same ``rocm-yolo train`` with ``--device`` naming its own GPUs, and the nodes
meet at torch's c10d rendezvous (:mod:`rocm_yolo.trainer.agent.rendezvous`). What forms the job,
each value on its own, the first found:

- the number of nodes: ``--nnodes N``, else ``SLURM_NNODES``;
- this node's id (rocm-yolo's own, 0..N-1: its files go to ``RUN/rocm_yolo/node-K/``): ``--node-rank K``,
  else ``SLURM_NODEID``;
- where the nodes meet: ``--rdzv-endpoint HOST:PORT``, else ``MASTER_ADDR`` and ``MASTER_PORT`` when set
  (Kubeflow's and most SLURM scripts' variables), else the first host of ``SLURM_JOB_NODELIST``
  (expanded here, without ``scontrol``: ``node[01-04]``, ``a[1,3-5],b2``) and a port derived from
  ``SLURM_JOB_ID`` (:func:`slurm_port`);
- how long the nodes wait for each other there: ``--rdzv-timeout`` (default 10 minutes).

One node (no flags and no SLURM job of several nodes, or ``--nnodes 1``) is no multi-node job:
:func:`resolve` returns None. Every mistake is a :class:`~rocm_yolo.errors.UsageError` of one line,
before anything starts. Pure logic: it reads the variables it is given and touches nothing.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from rocm_yolo import environment as env_names
from rocm_yolo.errors import UsageError
from rocm_yolo.run.devices import DEFAULT_RENDEZVOUS_TIMEOUT, Nodes

DEFAULT_PORT = 29400  # torch's c10d rendezvous port, when a job gives neither a port nor a job id
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 15000  # ports 15000-29999: below Linux's ephemeral range
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _split_top(text: str) -> list[str]:
    """``a[1,3-5],b2`` -> ``["a[1,3-5]", "b2"]``: the commas outside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("unbalanced '['")
    return items + [current]


def _expand_ranges(ranges: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]``, keeping the zero padding of each range."""
    out = []
    for part in ranges.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"not a range: {part!r}")
        if not dash:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"a range that runs backwards: {part!r}")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_host(item: str) -> list[str]:
    """One host expression, with any number of bracket groups: ``n[1-2]-ib[0-1]`` -> 4 hosts."""
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise ValueError(f"unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    return [head + value + rest for value in _expand_ranges(match[1]) for rest in _expand_host(tail)]


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list, expanded as ``scontrol show hostnames`` does: ``node[01-04]`` -> node01 ..
    node04; ``a[1,3-5],b2`` -> a1, a3, a4, a5, b2. ValueError for a list it cannot read."""
    hosts = []
    for item in _split_top(text.strip()):
        item = item.strip()
        if not item:
            raise ValueError("an empty host")
        hosts += _expand_host(item)
    return hosts


def slurm_port(job_id: str | int) -> int:
    """The rendezvous port of a SLURM job, the same on every node of it: 15000 + the job id modulo 15000.
    Two jobs on the same first host collide only if their ids are 15000 apart."""
    digits = re.sub(r"\D", "", str(job_id))  # array jobs: 1234_7
    return SLURM_PORT_BASE + int(digits or 0) % SLURM_PORT_SPAN


def parse_endpoint(text: str, what: str = "--rdzv-endpoint") -> str:
    """``HOST:PORT`` checked (an IPv6 host in brackets: ``[::1]:29400``); the endpoint as given."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or host in ("[]",) or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what} {text}: write HOST:PORT, the address where the nodes meet, e.g. node01:29400")
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
        raise UsageError(f"--rdzv-timeout {value}: give how long the nodes wait for each other, e.g. 600 or 10m")
    return seconds


def _whole(value: object, flag: str) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise UsageError(f"{flag} {value}: give a whole number")
    return int(str(value).strip())


def _endpoint_from(env: Mapping[str, str]) -> tuple[str | None, bool]:
    """Where a job's nodes meet by its variables (MASTER_ADDR/MASTER_PORT first), and whether SLURM said it."""
    host, port, slurm = env.get(env_names.MASTER_ADDR), env.get(env_names.MASTER_PORT), False
    if not host:
        nodelist = env.get(env_names.SLURM_JOB_NODELIST) or env.get(env_names.SLURM_NODELIST)
        if nodelist:
            try:
                host, slurm = expand_nodelist(nodelist)[0], True
            except (ValueError, IndexError) as e:
                raise UsageError(
                    f"{env_names.SLURM_JOB_NODELIST}={nodelist} cannot be read ({e}): give --rdzv-endpoint HOST:PORT"
                ) from None
    if not host:
        return None, False
    if not port:
        job = env.get(env_names.SLURM_JOB_ID) or env.get(env_names.SLURM_JOBID)
        port, slurm = (str(slurm_port(job)), True) if job else (str(DEFAULT_PORT), slurm)
    return parse_endpoint(f"{host}:{port}", f"{env_names.MASTER_ADDR}:{env_names.MASTER_PORT}"), slurm


def resolve(
    nnodes: object = None,
    node_rank: object = None,
    endpoint: object = None,
    timeout: object = None,
    env: Mapping[str, str] = os.environ,
) -> Nodes | None:
    """The nodes of the job this node belongs to (None: one machine), from the flags, else the scheduler's
    variables; UsageError for flags that do not form a job."""
    from_slurm = []
    count = _whole(nnodes, "--nnodes") if nnodes is not None else None
    if count is None and env.get(env_names.SLURM_NNODES, "").isdigit():
        count = int(env[env_names.SLURM_NNODES])
        from_slurm.append("nodes")
    if count is None or count == 1:
        given = [f for f, v in (("--node-rank", node_rank), ("--rdzv-endpoint", endpoint)) if v is not None]
        if given and count is None:
            raise UsageError(f"{given[0]} needs --nnodes N (the number of machines) and the other node flags")
        if timeout is not None and count is None:
            raise UsageError("--rdzv-timeout is for more than one machine: give --nnodes N and the other node flags")
        return None
    if count < 1:
        raise UsageError(f"--nnodes {count}: give the number of machines, 1 or more")
    node = _whole(node_rank, "--node-rank") if node_rank is not None else None
    if node is None and env.get(env_names.SLURM_NODEID, "").isdigit():
        node = int(env[env_names.SLURM_NODEID])
        from_slurm.append("node id")
    if node is None:
        raise UsageError(
            f"--nnodes {count} needs --node-rank K, this machine's number from 0 to {count - 1} (each node its own), "
            "and --rdzv-endpoint HOST:PORT, where the nodes meet"
        )
    if not 0 <= node < count:
        raise UsageError(f"--node-rank {node}: the {count} nodes of --nnodes {count} are numbered 0 to {count - 1}")
    if endpoint is not None:
        where = parse_endpoint(str(endpoint))
    else:
        where, slurm = _endpoint_from(env)
        if where is None:
            raise UsageError(
                f"--nnodes {count} needs --rdzv-endpoint HOST:PORT: the address where the nodes meet, one of them "
                "(e.g. node01:29400), the same on every node"
            )
        from_slurm += ["endpoint"] if slurm else []
    seconds = parse_timeout(timeout) if timeout is not None else DEFAULT_RENDEZVOUS_TIMEOUT
    return Nodes(count=count, node=node, endpoint=where, timeout=seconds, source="SLURM" if from_slurm else "flags")
