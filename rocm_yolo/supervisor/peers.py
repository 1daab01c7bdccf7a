"""More than one machine: the other nodes, as this node's supervisor sees them (each of it nothing on one machine).

- While it runs, the supervisor says it is alive in the run's shared folder (:class:`rocm_yolo.run.nodes.SayAlive`),
  so that the others can tell a node gone.
- After a failed attempt, the other nodes gone since the last one (:func:`nodes_lost`): the attempt failed for them,
  not for a cause of this node's, and the nodes meet again in the next round, on the same profile, with no restart
  spent (:func:`next_round`).
- After ranks failed in a collective, another node that restarted first and waits in a later round: this node's
  ranks failed for its fault, and this node follows it there with no restart spent (:func:`follows_another`).
- A node that stops for good says so in the run's shared folder (:func:`tell_other_nodes`), and the others stop with
  its exit code at their next restart (:func:`other_node_stopped`).

:class:`Peers` holds what the loop (:mod:`.loop`) keeps of them: its sign of life, the nodes known gone.
"""

from __future__ import annotations

from rocm_yolo.process.output import RunLog
from rocm_yolo.run.events import read_events
from rocm_yolo.run.nodes import LOST_AFTER, NodeStop, SayAlive, later_round, lost_nodes, record_stop, stopped_node
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import RunState
from rocm_yolo.supervisor.restart import next_spec, resume_command
from rocm_yolo.supervisor.states import AttemptState, RunResult


class Peers:
    """The other nodes of a run, for one node's supervisor: its sign of life while it runs, the nodes gone since the
    last failure, a node that stopped for good, and this node's own stop told (each said in ``log``)."""

    def __init__(self, spec: RunSpec, clock, sleep):
        self.clock, self.sleep = clock, sleep
        self.gone: set[int] = set()  # the other nodes known gone (no failure of theirs twice)
        self._alive = SayAlive(spec.paths) if spec.nodes is not None else None

    def start(self) -> None:
        """Say this node is alive until :meth:`stop` (the other nodes see it)."""
        if self._alive is not None:
            self._alive.start()

    def stop(self) -> None:
        if self._alive is not None:
            self._alive.stop()

    def lost(self, spec: RunSpec, log: RunLog) -> bool:
        """After a failed attempt: another node is gone since the last failure (its supervisor stopped answering)."""
        return bool(nodes_lost(spec, self.clock, self.sleep, log, self.gone))

    def follows(self, spec: RunSpec, log: RunLog) -> bool:
        """After ranks failed in a collective: another node restarted first (:func:`follows_another`)."""
        return follows_another(spec, self.clock, self.sleep, log)


# the run's ends that no restart of its own follows
FOR_GOOD = (RunState.USAGE_ERROR, RunState.SETUP_FAILED, RunState.INTERNAL_ERROR, RunState.FAILED)


def tell_other_nodes(spec: RunSpec, result: RunResult, log: RunLog) -> None:
    """This node's run ends for good (``result``'s state and exit code say how): on more than one machine the run's
    shared folder says so (``round.json``), and the other nodes stop too (:func:`other_node_stopped`). A stop by a
    signal is no such end: the others wait for the node at the rendezvous (``scancel`` stops them all)."""
    if spec.nodes is None or result.state not in FOR_GOOD:
        return
    stop = NodeStop(spec.nodes.node, result.exit_code, _reason(spec, result))
    try:
        kept = record_stop(spec.paths, stop, spec.nodes.round, spec.profile)
    except OSError as e:
        log.info(
            f"cannot tell the other nodes in {spec.paths.round} that this node stops ({e.strerror or e}): they wait "
            f"for it at the rendezvous up to --rdzv-timeout"
        )
        return
    if kept == stop:  # the node's own last line stays its reason's
        log.event("node_stop", path=str(spec.paths.round), exit_code=stop.exit_code, reason=stop.reason)


def next_round(spec: RunSpec, log: RunLog) -> RunSpec:
    """The attempt after one that ended because the nodes meet again (a node joins, or one is gone): the next round,
    the same profile, the newest checkpoint; no restart spent."""
    spec = next_spec(spec, (spec.profile,), log)
    log.event(
        "rejoin",
        f"meeting the other nodes in round {spec.nodes.round} of the rendezvous on profile '{spec.profile}'"
        + (f" from {spec.resume}" if spec.resume else " from the start")
        + " (no restart spent)",
        attempt=spec.attempt,
        round=spec.nodes.round,
        profile=spec.profile,
        resume=spec.resume,
    )
    return spec


def nodes_lost(spec: RunSpec, clock, sleep, log: RunLog, gone: set[int]) -> list[int]:
    """After a failed attempt on more than one machine: the other nodes gone since the last one (their supervisors
    stopped answering), said in one line; the attempt failed for them, not for a cause of this node's. ``gone``: the
    nodes known gone, kept up to date (one that answers again is no longer; one gone before is no cause now)."""
    if spec.nodes is None:
        return []
    stop = stopped_node(spec.paths)
    if stop is not None and stop.node != spec.nodes.node:
        return []  # a node that stopped for good said so: every node stops (other_node_stopped)
    silent = lost_nodes(spec.paths, spec.nodes, clock, sleep)
    lost = [k for k in silent if k not in gone]
    gone.clear()
    gone.update(silent)
    if not lost:
        return []
    n = spec.nodes
    names, many = " and ".join(f"node {k}" for k in lost), len(lost) > 1
    them = "them" if many else "it"
    left = n.count - len(lost)
    then = (
        f"the run goes on with the {left} left (--nnodes {n.nnodes}) once the rendezvous waited {n.timeout:.0f} s "
        f"for {them}"
        if n.elastic and left >= n.minimum
        else f"this node waits for {them} at the rendezvous, up to {n.timeout:.0f} s"
    )
    log.event(
        "node_lost",
        f"{names} of {n.count} {'are' if many else 'is'} gone (no sign of {'their' if many else 'its'} "
        f"supervisor{'s' if many else ''} for {LOST_AFTER:.0f} s): this node's ranks stopped for {them}, not for a "
        f"fault of their own; {then}",
        nodes=lost,
        round=n.round,
    )
    return lost


def follows_another(spec: RunSpec, clock, sleep, log: RunLog) -> bool:
    """After an attempt on more than one machine whose ranks failed in a collective: whether another node restarted
    first and waits in a later round (its own failure made this node's ranks fail in its collectives), said in one
    line; this node follows it there, with no remedy of its own (the peer-to-peer one is for a collective that
    fails by itself) and no restart spent."""
    later = later_round(spec.paths, spec.nodes, clock, sleep) if spec.nodes is not None else None
    if later is None:
        return False
    log.event(
        "follow",
        f"another node restarted first and waits in round {later}: this node's ranks failed in its collectives, "
        "not for a fault of their own; this node follows it there",
        round=spec.nodes.round,
        next_round=later,
    )
    return True


def other_node_stopped(spec: RunSpec, outcome: AttemptState, log: RunLog) -> NodeStop | None:
    """On more than one machine, after an attempt that failed (``outcome``): another node stopped for good (its record
    in ``round.json``), so this one stops too, said in one line naming the node and its reason; None otherwise."""
    if spec.nodes is None or outcome not in (AttemptState.CRASHED, AttemptState.STALLED, AttemptState.FAILED):
        return None
    found = stopped_node(spec.paths)
    if found is None or found.node == spec.nodes.node:
        return None
    log.event(
        "node_stopped",
        f"{found.describe(spec.nodes.count)}: this node stops too (exit {found.exit_code}); once that is fixed, "
        f"continue with {resume_command(spec)}",
        node=found.node,
        exit_code=found.exit_code,
        reason=found.reason,
    )
    return found


def _reason(spec: RunSpec, result: RunResult) -> str:
    """Why this node's run ends, in one line: its verdict, or what its processes said of the error."""
    if result.verdict:
        return str(result.verdict[0])
    kinds = {
        RunState.INTERNAL_ERROR: "internal_error",
        RunState.USAGE_ERROR: "user_error",
        RunState.SETUP_FAILED: "setup_error",
    }
    kind = kinds.get(result.state)
    said = [e for e in read_events(spec.paths.events) if kind and e.get("event") == kind and e.get("error")]
    if said:
        prefix = {"internal_error": "internal error", "user_error": "error"}.get(kind, "environment error")
        return f"{prefix}: {said[-1]['error']}"
    if result.state == RunState.INTERNAL_ERROR:
        return "internal error"
    if result.detail:
        return result.detail
    if result.failures:
        return f"{result.failures[-1].title}, with no restarts left"
    return "failed"
