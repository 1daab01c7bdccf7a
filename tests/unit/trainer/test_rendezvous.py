"""More than one machine, the launcher's side: torch's launcher with the c10d rendezvous, the wait, a rendezvous
tried again, the nodes that did not come, a node that stopped for good, success judged by the ranks, torch's agent
quiet once its ranks finished; the ranks' world size; faults aimed at a node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types

from rocm_yolo import errors
from rocm_yolo.run.devices import Nodes, NodeStop, join_round, record_stop
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.profiles import resolve
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.testing import faults
from rocm_yolo.trainer.agent import launcher, ranks, rendezvous
from rocm_yolo.trainer.agent.rendezvous import Meeting
from rocm_yolo.trainer.agent.torchrun import RENDEZVOUS_FAILED, RENDEZVOUS_TIMEOUT


def node_spec(tmp_path, node=0, count=3, timeout=100.0, round_number=2) -> RunSpec:
    r = resolve("fast", 1, cpu_count=4)
    return RunSpec(
        data="d.yaml", model="m.yaml", run_dir=str(tmp_path), profile="fast", loader=r.loader, val=r.val,
        train_args={"device": "0,1"}, nodes=Nodes(count, node, "head:29400", timeout, "flags", round_number),
    )  # fmt: skip


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quiet() -> RunLog:
    return RunLog(stream=open(os.devnull, "w"))


def test_each_node_starts_torchs_launcher_on_the_c10d_rendezvous_of_its_round(tmp_path):
    clock = Clock()
    meeting = Meeting(node_spec(tmp_path), quiet(), clock=clock)
    cmd = meeting.command("spec.json", 2, "torchrun.log")
    flags = dict(zip(cmd[4::2], cmd[5::2]))
    assert cmd[2:4] == ["rocm_yolo.trainer.agent.torchrun", "torchrun.log"] and cmd[-3:] == [
        "-m",
        "rocm_yolo.trainer",
        "spec.json",
    ]
    assert flags["--nnodes"] == "3" and flags["--nproc_per_node"] == "2" and flags["--rdzv-backend"] == "c10d"
    assert flags["--rdzv-endpoint"] == "head:29400" and flags["--rdzv-id"] == "rocm-yolo-round-2"
    assert flags["--rdzv-conf"] == "join_timeout=100" and flags["--max-restarts"] == "0"
    assert "--node-rank" not in cmd and "--master_port" not in cmd  # c10d assigns the group ranks
    clock.now += 70.5  # a second try waits only for what is left of --rdzv-timeout
    assert "join_timeout=30" in meeting.command("spec.json", 2, "torchrun.log")


def test_a_rendezvous_that_fails_before_any_rank_runs_is_tried_again_while_time_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    clock = Clock()
    meeting = Meeting(node_spec(tmp_path, timeout=60.0), quiet(), clock=clock)
    assert meeting.again(RENDEZVOUS_FAILED, heard=False)  # the store went away with an old round's agent
    assert not meeting.again(RENDEZVOUS_FAILED, heard=True)  # the ranks ran: a crash for the supervisor
    assert not meeting.again(RENDEZVOUS_TIMEOUT, heard=False) and not meeting.again(1, heard=False)
    clock.now += 59
    assert not meeting.again(RENDEZVOUS_FAILED, heard=False)  # no time left
    assert meeting.missed(RENDEZVOUS_TIMEOUT, False) and meeting.missed(RENDEZVOUS_FAILED, False)
    assert not meeting.missed(RENDEZVOUS_FAILED, True) and not meeting.missed(1, False)


def test_the_nodes_missing_are_those_not_waiting_in_this_round(tmp_path):
    spec = node_spec(tmp_path, node=0, count=4, round_number=3)
    meeting = Meeting(spec, quiet())
    meeting.mark()
    paths = RunPaths(tmp_path, None)
    waiting = {"round": 3, "endpoint": "head:29400", "pid": 1, "time": 0}
    paths.for_node(1).node_dir.mkdir(parents=True)
    paths.for_node(1).rendezvous.write_text(json.dumps(waiting))  # waits with us
    paths.for_node(2).node_dir.mkdir(parents=True)
    paths.for_node(2).rendezvous.write_text(json.dumps({**waiting, "round": 2}))  # still in the round before
    paths.for_node(3).node_dir.mkdir(parents=True)
    stale = paths.for_node(3).rendezvous
    stale.write_text(json.dumps(waiting))
    old = meeting.paths.rendezvous.stat().st_mtime - 600
    os.utime(stale, (old, old))  # waited here once, then went away (its file is not rewritten)
    assert meeting.missing() == [2, 3]
    lines = []
    meeting.log = types.SimpleNamespace(event=lambda kind, line, **fields: lines.append(line))
    assert meeting.give_up() == errors.NODES_MISSING
    [line] = lines
    assert line.startswith("node 2 and node 3 of 4 did not come to the rendezvous at head:29400 within 100 s")
    assert f"rocm-yolo train --resume {tmp_path}" in line and "\n" not in line


def test_once_another_node_stopped_for_good_this_nodes_agent_is_stopped_waiting_or_training(tmp_path):
    """round.json says node 1 stopped for good: node 0's launcher stops torch's launcher (SIGTERM; SIGKILL after
    the grace) within one look, tries no rendezvous again, and the launch ends as the nodes' meeting does."""
    spec = node_spec(tmp_path, node=0, count=2, round_number=2)
    join_round(spec.paths, "fast", after=1)
    clock = Clock()
    meeting = Meeting(spec, quiet(), clock=clock)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record_stop(spec.paths.for_node(0), NodeStop(0, 1, "mine"), 2, "fast")  # its own stop: not a reason
        meeting._halt(agent)
        assert agent.poll() is None and meeting.halted is None
        spec.paths.round.unlink()
        join_round(spec.paths, "fast", after=1)
        record_stop(spec.paths.for_node(1), NodeStop(1, errors.INTERNAL, "internal error: KeyError"), 2, "fast")
        assert meeting.wait(agent, heard=lambda: False) == -signal.SIGTERM
    finally:
        agent.kill()
    assert meeting.halted == NodeStop(1, errors.INTERNAL, "internal error: KeyError")
    assert not meeting.again(RENDEZVOUS_FAILED, heard=False)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # as if it had not stopped
    try:
        meeting._halt(stuck)  # halted already: within the grace, nothing more
        assert stuck.poll() is None
        clock.now += rendezvous.HALT_GRACE + 1
        assert meeting.wait(stuck, heard=lambda: True) == -signal.SIGKILL
    finally:
        stuck.kill()


def test_once_this_nodes_ranks_all_ended_their_training_torchs_agent_talks_into_its_log(tmp_path):
    """The agent that did not host the rendezvous' store warns "recvVector failed" with 16 lines of C++ frames as it
    shuts down after a finished run: from its exit barrier on (every rank of the node exited 0), its stderr goes to
    torchrun.log, not the terminal."""
    code = (
        "import os, sys\n"
        "from torch.distributed.elastic.agent.server.api import SimpleElasticAgent\n"
        "SimpleElasticAgent._exit_barrier = lambda self: os.write(2, b'recvVector failed\\n')\n"
        "from rocm_yolo.trainer.agent import torchrun\n"
        "torchrun._teardown_into(sys.argv[1])\n"
        "torchrun._teardown_into(sys.argv[1])\n"  # once is enough
        "os.write(2, b'training\\n')\n"
        "SimpleElasticAgent._exit_barrier(object())\n"
        "os.write(2, b'teardown\\n')\n"
    )
    log = tmp_path / "torchrun.log"
    out = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "training\n", out.stderr
    assert log.read_text() == "recvVector failed\nteardown\n"


def test_success_is_every_rank_of_this_node_ending_its_training_whatever_torchs_launcher_says():
    assert launcher.outcome(0, {}) == errors.OK
    # the agent that did not host the rendezvous' store exits 1 at the end (DistNetworkError): training is done
    assert launcher.outcome(RENDEZVOUS_FAILED, {2: 0, 3: 0}, ranks=2) == errors.OK
    assert launcher.outcome(1, {2: 0}, ranks=2) == errors.FAILED  # rank 3 said nothing: it died
    assert launcher.outcome(1, {2: 0, 3: 1}, ranks=2) == errors.FAILED
    assert launcher.outcome(1, {2: errors.USAGE, 3: 1}, ranks=2) == errors.USAGE


def test_a_rank_trains_with_the_global_world_size(monkeypatch):
    class Base:
        def __init__(self, *args, **kwargs):
            self.world_size = 2  # Ultralytics: the ids of --device, this node's GPUs
            self.ran = []

        def run_callbacks(self, event):
            self.ran.append(event)

        def get_dataloader(self, path, batch_size=16, rank=0, mode="train"):
            return (path, batch_size, rank, mode)

    model = types.SimpleNamespace(task="detect", task_map={"detect": {"trainer": Base}})
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    trainer = ranks.trainer_class(model, nodes=2)()
    assert trainer.world_size == 4 and trainer.ran == ["on_pretrain_routine_start"]  # Ultralytics: rank 0 only
    assert trainer.get_dataloader("train", 8, rank=-1) == ("train", 8, -1, "train")  # no process group here
    assert trainer.get_dataloader("train", 8, rank=0, mode="val") == ("train", 8, 0, "val")
    monkeypatch.setenv("RANK", "0")
    assert ranks.trainer_class(model)().ran == []


def test_a_fault_aims_at_the_first_rank_of_a_node(monkeypatch):
    [fault] = faults.parse("worker-hang@2:1:n1")
    assert (fault.epoch, fault.batch, fault.rank, fault.node) == (2, 1, None, 1)
    monkeypatch.setenv("ROCM_YOLO_NODE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "2")
    assert fault.aimed_here()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not fault.aimed_here()
    monkeypatch.setenv("ROCM_YOLO_NODE", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not fault.aimed_here()
    assert faults.parse("kill@1:2:3")[0].aimed_here() is False and faults.parse("kill@1:2:2")[0].aimed_here()
