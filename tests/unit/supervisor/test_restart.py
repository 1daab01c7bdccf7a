"""What the supervisor does between attempts and at the end: the writes a stop or a kill cut short, what of a
finished run's end did not happen, and on more than one machine a node that stops for good stopping every node."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from dataclasses import replace

import fakes
from fakes import Clock, ScriptedChild
from helpers import fake_checkpoint
from rocm_yolo import errors
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.events import read_events
from rocm_yolo.run.nodes import Nodes, NodeStop, join_round, mark_round_started, read_round, record_stop
from rocm_yolo.run.supervisor_state import RunState
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.peers import tell_other_nodes
from rocm_yolo.supervisor.restart import remove_cut_writes, remove_leftovers, tidy_finished
from rocm_yolo.supervisor.states import RunResult

CONFIG = WatchdogConfig(stall_timeout=60, step_multiplier=10, startup_grace=300, max_restarts=2, poll_interval=1)


def said(spec) -> tuple[RunLog, io.StringIO]:
    out = io.StringIO()
    return RunLog(spec.paths.log, spec.paths.events, stream=out), out


def a_dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_the_temporary_files_of_writes_cut_short_go_once_their_writer_is_gone_and_only_this_nodes(spec):
    weights = spec.paths.weights
    weights.mkdir(parents=True)
    (weights / "last.pt").write_bytes(b"kept")
    dead = a_dead_pid()
    cut = weights / f".ep2-ba12.pt.{dead}.tmp"
    writing = weights / f".last.pt.{os.getpid()}.tmp"  # a writer still alive: its write goes on
    other = weights / f".last_good.pt.n1-{dead}.tmp"  # another node's: its rank may be writing it now
    for path in (cut, writing, other):
        path.write_bytes(b"half")
    log, out = said(spec)
    assert remove_cut_writes(spec, log) == ["ep2-ba12.pt"]
    assert sorted(p.name for p in weights.iterdir()) == sorted(["last.pt", writing.name, other.name])
    assert out.getvalue() == (
        f"rocm-yolo: the write of {weights / 'ep2-ba12.pt'} was cut short as the training process ended: its "
        "temporary file is removed; the checkpoints before it are kept\n"
    )
    [event] = [e for e in read_events(spec.paths.events) if e["event"] == "write_cut_short"]
    assert event["target"] == "ep2-ba12.pt" and event["path"] == str(cut)
    node1 = replace(spec, nodes=Nodes(count=2, node=1, endpoint="127.0.0.1:29400"))
    assert remove_cut_writes(node1, said(node1)[0]) == ["last_good.pt"]  # node 1's own, by its node
    assert sorted(p.name for p in weights.iterdir()) == sorted(["last.pt", writing.name])


def checkpoint(path, epoch: int) -> None:
    """An Ultralytics checkpoint of a 3-epoch run after ``epoch`` (0-based); -1: stripped by the end of training."""
    fake_checkpoint(path, pickle.dumps({"epoch": epoch, "train_args": {"epochs": 3}, "optimizer": None}))


def test_a_finished_run_says_what_of_its_end_did_not_happen(spec):
    paths = spec.paths
    # the training process was killed rewriting last.pt: neither file was stripped, nothing was validated
    checkpoint(paths.last, 2)
    checkpoint(paths.best, 1)
    log, out = said(spec)
    assert tidy_finished(spec, log, cut_short=True) == "the final validation did not run"
    assert out.getvalue() == (
        "rocm-yolo: the training process failed after the last epoch, in the end of training: last.pt and best.pt "
        "still hold the optimizer (the end of training strips it; the weights load and predict as they are), and "
        f"the final validation did not run; validate with yolo val model={paths.best} data=d.yaml\n"
    )
    # killed rewriting best.pt: last.pt is stripped
    checkpoint(paths.last, -1)
    log, out = said(spec)
    assert tidy_finished(spec, log, cut_short=True) == "the final validation did not run"
    assert "in the end of training: best.pt still holds the optimizer" in out.getvalue()
    # both stripped: the crash came in the final validation
    checkpoint(paths.best, -1)
    log, out = said(spec)
    assert tidy_finished(spec, log, cut_short=True) == "the final validation did not finish"
    assert "in the end of training: the final validation did not finish; validate with" in out.getvalue()
    # a run that ended as it should says nothing more
    log, out = said(spec)
    assert tidy_finished(spec, log) is None and out.getvalue() == ""
    # a stop in the end of training (its own line says the rest): the file it did not strip
    checkpoint(paths.best, 1)
    log, out = said(spec)
    assert tidy_finished(spec, log) is None
    assert out.getvalue() == (
        "rocm-yolo: the end of training was cut short: best.pt still holds the optimizer (the end of training "
        "strips it; the weights load and predict as they are)\n"
    )


def node_spec(spec, node: int):
    nodes = Nodes(count=2, node=node, endpoint="127.0.0.1:29400", round=1)
    return replace(spec, nodes=nodes, train_args={"epochs": 3, "device": "0,1"})


def test_a_node_that_stops_for_good_stops_every_node_with_its_exit_code_and_reason(spec):
    """Node 1's rank fails in its set-up with an internal error: node 1 stops (123) and says so in round.json;
    node 0, whose ranks failed with it, stops at its next restart with the same code and a line naming node 1."""
    node0, node1 = node_spec(spec, 0), node_spec(spec, 1)
    join_round(node0.paths, "fast")
    mark_round_started(node0.paths, 1)
    RunLog(events_path=node1.paths.events, rank=2).event("internal_error", error="KeyError: 'injected'")
    clock = Clock()
    result, made = fakes.supervise(node1, [ScriptedChild(clock, {}, exit_at=1, code=errors.INTERNAL)], clock, CONFIG)
    assert result.exit_code == errors.INTERNAL and len(made) == 1
    stop = NodeStop(1, errors.INTERNAL, "internal error: KeyError: 'injected'")
    assert read_round(node0.paths).stopped == stop
    clock = Clock()
    sup = fakes.supervisor(node0, [ScriptedChild(clock, {}, exit_at=1, code=1)], clock, CONFIG)
    out = io.StringIO()
    sup.log = RunLog(node0.paths.log, node0.paths.events, stream=out)
    result = sup.run()
    assert result.exit_code == errors.INTERNAL and result.restarts == 0 and result.state == "failed"
    assert result.detail == "node 1 of 2 stopped for good (exit 123: internal error: KeyError: 'injected')"
    line = [x for x in out.getvalue().splitlines() if "stopped for good" in x]
    assert line == [
        f"rocm-yolo: {result.detail}: this node stops too (exit 123); once that is fixed, continue with "
        f"rocm-yolo train --resume {node0.paths.last} and the same node flags, on every node"
    ]
    assert read_round(node0.paths).stopped == stop  # node 0 said nothing new: the first stop stays


def test_a_node_waiting_at_the_rendezvous_when_another_stops_for_good_stops_with_it(spec):
    """Node 0 restarted into round 2 before node 1 stopped: its launcher, waiting there, saw the stop and ended
    (NODES_MISSING); the supervisor stops with node 1's code. Without a stop, the same exit is a node that did not
    come (exit 1); and a stop by a signal is no stop for good: the others wait for that node."""
    node0 = replace(node_spec(spec, 0), nodes=replace(node_spec(spec, 0).nodes, round=2))
    join_round(node0.paths, "fast", after=1)
    record_stop(node0.paths.for_node(1), NodeStop(1, errors.SETUP, "environment error: disk full"), 2, "fast")
    clock = Clock()
    child = ScriptedChild(clock, {}, exit_at=1, code=errors.NODES_MISSING)
    result, _ = fakes.supervise(node0, [child], clock, CONFIG)
    assert result.exit_code == errors.SETUP and "node 1 of 2 stopped for good" in result.detail
    node0.paths.round.unlink()
    join_round(node0.paths, "fast")
    clock = Clock()
    child = ScriptedChild(clock, {}, exit_at=1, code=errors.NODES_MISSING)
    result, _ = fakes.supervise(node0, [child], clock, CONFIG)
    assert result.exit_code == errors.FAILED and result.detail == "a node did not come to the rendezvous"
    assert read_round(node0.paths).stopped.node == 0  # node 0 stops for good: node 1, if it comes, stops too
    node0.paths.round.unlink()
    join_round(node0.paths, "fast")
    stopped = RunResult(RunState.INTERRUPTED, errors.TERMINATED, node0.run_dir, node=0)
    tell_other_nodes(node0, stopped, said(node0)[0])
    assert read_round(node0.paths).stopped is None


def test_after_an_attempt_its_dead_processes_stack_files_and_a_killed_trainers_pymp_folder_go(spec, tmp_path):
    """stacks/ gains a file for every process of every attempt, and a SIGKILLed trainer leaves multiprocessing's
    /tmp/pymp-* (its fork server's socket): both go once the tree is gone, and only what is the run's to remove: a
    live process's stack file stays, and so does a pymp- folder of another user's or a link (issue 45)."""
    from helpers import as_stranger
    from rocm_yolo.process.output import RunLog
    from rocm_yolo.run.atomic import private_dirs

    paths = spec.paths
    private_dirs(paths.state, paths.stacks)
    dead = a_dead_pid()
    for name in (f"trainer-{dead}.txt", f"worker-{dead}.txt", f"worker-{os.getpid()}.txt"):
        (paths.stacks / name).write_text("")
    killed, other, elsewhere = (tmp_path / "tmp" / name for name in ("pymp-killed", "pymp-other", "elsewhere"))
    for folder in (killed, other, elsewhere):
        (folder / "inside").mkdir(parents=True)
    linked = tmp_path / "tmp" / "pymp-linked"
    linked.symlink_to(elsewhere)
    log = RunLog(None, paths.events)
    for folder in (killed, other, linked):
        log.event("mp_tempdir", path=str(folder), pid=dead)  # what a trainer records of itself
    log.event("mp_tempdir", path=str(elsewhere), pid=dead)  # not multiprocessing's: never removed
    log.event("mp_tempdir", path=str(killed), pid=os.getpid())
    as_stranger(other)
    removed = set(remove_leftovers(spec))
    assert removed == {paths.stacks / f"trainer-{dead}.txt", paths.stacks / f"worker-{dead}.txt", killed}
    assert sorted(p.name for p in paths.stacks.iterdir()) == [f"worker-{os.getpid()}.txt"]
    assert other.is_dir() and linked.is_symlink() and (elsewhere / "inside").is_dir()
    (paths.stacks / f"worker-{os.getpid()}.txt").unlink()
    remove_leftovers(spec)
    assert not paths.stacks.exists()  # an empty stacks/ goes too: a finished run keeps no empty folder
