"""The schedulers whose variables form a multi-node job: each one a small backend that owns its own variables.

As submitit's ``JobEnvironment`` does, each scheduler names the variables it sets in every task of a job (its
own: :attr:`Scheduler.variables`) and says from them how many nodes the job has, which one this is and the first
host. :mod:`.cluster` asks them in
:data:`SCHEDULERS`' order, value by value, where the node flags say nothing. SLURM is the one today; another
(PBS, LSF, Flux) is one more class with the same three methods, named in :data:`SCHEDULERS`. No scheduler gives a
port: what every node could derive from a job's variables, anyone who can list the jobs could derive too (the port
is the run's own: :mod:`.cluster`). Pure logic: each reads the variables it is given.
"""

from __future__ import annotations

import re
from typing import Mapping, Protocol

from rocm_yolo.errors import UsageError, option


class Scheduler(Protocol):
    """What a scheduler's variables say of the job this task belongs to (None: they say nothing of it)."""

    name: str  # where the job came from, in the run's header (``Nodes.source``)
    variables: tuple[str, ...]  # every variable of the scheduler's it reads (a test's process strips them)

    def nodes(self, env: Mapping[str, str]) -> int | None:
        """How many nodes the job has."""

    def node(self, env: Mapping[str, str]) -> int | None:
        """This node's id in the job, 0..N-1."""

    def first_host(self, env: Mapping[str, str]) -> str | None:
        """The job's first host, where the nodes meet; UsageError when the variable cannot be read."""


def _whole(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


class Slurm:
    """SLURM's variables, as ``sbatch`` and ``srun`` set them in every task: ``SLURM_NNODES``, ``SLURM_NODEID``,
    ``SLURM_JOB_NODELIST`` (older: ``SLURM_NODELIST``)."""

    name = "SLURM"
    NNODES, NODEID, JOB_NODELIST, NODELIST = "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"
    variables = (NNODES, NODEID, JOB_NODELIST, NODELIST)

    def nodes(self, env: Mapping[str, str]) -> int | None:
        return _whole(env, self.NNODES)

    def node(self, env: Mapping[str, str]) -> int | None:
        return _whole(env, self.NODEID)

    def first_host(self, env: Mapping[str, str]) -> str | None:
        nodelist = env.get(self.JOB_NODELIST) or env.get(self.NODELIST)
        if not nodelist:
            return None
        try:
            return expand_nodelist(nodelist)[0]
        except (ValueError, IndexError) as e:
            raise UsageError(
                f"{self.JOB_NODELIST}={nodelist} cannot be read ({e}): give " + option("rdzv_endpoint", "HOST:PORT")
            ) from None


SCHEDULERS: tuple[Scheduler, ...] = (Slurm(),)  # asked in this order


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
