"""The DDP launcher: the run's exit code from the ranks', the relay of their heartbeats; on more than one machine
torch's launcher with the c10d rendezvous, the wait, a rendezvous tried again, the nodes that did not come, a node
that stopped for good, success judged by the ranks, torch's agent quiet once its ranks finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from dataclasses import replace

import pytest

from rocm_yolo import errors
from rocm_yolo.ddp import launcher, rendezvous
from rocm_yolo.ddp.relay import Relay
from rocm_yolo.ddp.rendezvous import NodeRendezvous
from rocm_yolo.ddp.torchrun import RENDEZVOUS_FAILED, RENDEZVOUS_TIMEOUT
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import heartbeat
from rocm_yolo.run.nodes import Nodes, NodeStop, join_round, mark_round_started, record_stop
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec


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


def test_each_node_starts_torchs_launcher_on_the_c10d_rendezvous_of_its_round(tmp_path, monkeypatch):
    clock = Clock()
    rdzv = NodeRendezvous(node_spec(tmp_path), quiet(), clock=clock)
    monkeypatch.setattr(rendezvous, "port_holder", lambda port: None)  # node 0 finds head:29400 free
    cmd = rdzv.command("spec.json", 2, "torchrun.log")
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert cmd[1:5] == ["-P", "-m", "rocm_yolo.ddp.torchrun", "torchrun.log"] and cmd[-3:] == [
        "-m",
        "rocm_yolo.trainer",
        "spec.json",
    ]
    assert flags["--nnodes"] == "3" and flags["--nproc_per_node"] == "2" and flags["--rdzv-backend"] == "c10d"
    assert flags["--rdzv-endpoint"] == "head:29400" and flags["--rdzv-id"] == "rocm-yolo-round-2"
    assert flags["--rdzv-conf"] == "join_timeout=100,is_host=1" and flags["--max-restarts"] == "0"  # node 0 hosts
    assert "--node-rank" not in cmd and "--master_port" not in cmd  # c10d assigns the group ranks
    clock.now += 70.5  # a second try waits only for what is left of --rdzv-timeout
    assert "join_timeout=30,is_host=1" in rdzv.command("spec.json", 2, "torchrun.log")
    other = NodeRendezvous(node_spec(tmp_path, node=1), quiet(), clock=clock).command("spec.json", 2, "t.log")
    assert "join_timeout=100,is_host=0" in other  # the other nodes only connect: never a store of their own


def test_a_rendezvous_that_fails_before_any_rank_runs_is_tried_again_while_time_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    clock = Clock()
    rdzv = NodeRendezvous(node_spec(tmp_path, timeout=60.0), quiet(), clock=clock)
    assert rdzv.again(RENDEZVOUS_FAILED, heard=False)  # the store went away with an old round's agent
    assert not rdzv.again(RENDEZVOUS_FAILED, heard=True)  # the ranks ran: a crash for the supervisor
    assert not rdzv.again(RENDEZVOUS_TIMEOUT, heard=False) and not rdzv.again(1, heard=False)
    clock.now += 59
    assert not rdzv.again(RENDEZVOUS_FAILED, heard=False)  # no time left
    assert rdzv.missed(RENDEZVOUS_TIMEOUT, False) and rdzv.missed(RENDEZVOUS_FAILED, False)
    assert not rdzv.missed(RENDEZVOUS_FAILED, True) and not rdzv.missed(1, False)


def test_the_nodes_missing_are_those_not_waiting_in_this_round(tmp_path):
    spec = node_spec(tmp_path, node=0, count=4, round_number=3)
    rdzv = NodeRendezvous(spec, quiet())
    rdzv.mark()
    paths = RunPaths(tmp_path, None)
    waiting = {"round": 3, "endpoint": "head:29400", "pid": 1, "time": 0}
    paths.for_node(1).node_dir.mkdir(parents=True)
    paths.for_node(1).rendezvous.write_text(json.dumps(waiting))  # waits with us
    paths.for_node(2).node_dir.mkdir(parents=True)
    paths.for_node(2).rendezvous.write_text(json.dumps({**waiting, "round": 2}))  # still in the round before
    paths.for_node(3).node_dir.mkdir(parents=True)
    stale = paths.for_node(3).rendezvous
    stale.write_text(json.dumps(waiting))
    old = rdzv.paths.rendezvous.stat().st_mtime - 600
    os.utime(stale, (old, old))  # waited here once, then went away (its file is not rewritten)
    assert rdzv.missing() == [2, 3]
    lines = []
    rdzv.log = types.SimpleNamespace(event=lambda kind, line, **fields: lines.append(line))
    assert rdzv.give_up() == errors.NODES_MISSING
    [line] = lines
    assert line.startswith("node 2 and node 3 of 4 did not come to the rendezvous at head:29400 within 100 s")
    assert f"rocm-yolo train --resume {tmp_path}" in line and "\n" not in line


def test_once_another_node_stopped_for_good_this_nodes_agent_is_stopped_waiting_or_training(tmp_path):
    """round.json says node 1 stopped for good: node 0's launcher stops torch's launcher (SIGTERM; SIGKILL after
    the grace) within one look, tries no rendezvous again, and the launch ends as the nodes' meeting does."""
    spec = node_spec(tmp_path, node=0, count=2, round_number=2)
    join_round(spec.paths, "fast", after=1)
    clock = Clock()
    rdzv = NodeRendezvous(spec, quiet(), clock=clock)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record_stop(spec.paths.for_node(0), NodeStop(0, 1, "mine"), 2, "fast")  # its own stop: not a reason
        rdzv._halt(agent)
        assert agent.poll() is None and rdzv.halted is None
        spec.paths.round.unlink()
        join_round(spec.paths, "fast", after=1)
        record_stop(spec.paths.for_node(1), NodeStop(1, errors.INTERNAL, "internal error: KeyError"), 2, "fast")
        assert rdzv.wait(agent, heard=lambda: False) == -signal.SIGTERM
    finally:
        agent.kill()
    assert rdzv.halted == NodeStop(1, errors.INTERNAL, "internal error: KeyError")
    assert not rdzv.again(RENDEZVOUS_FAILED, heard=False)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # as if it had not stopped
    try:
        rdzv._halt(stuck)  # halted already: within the grace, nothing more
        assert stuck.poll() is None
        clock.now += rendezvous.HALT_GRACE + 1
        assert rdzv.wait(stuck, heard=lambda: True) == -signal.SIGKILL
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
        "from rocm_yolo.ddp import torchrun\n"
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


@pytest.mark.parametrize(
    "code, exits, expected",
    [
        (0, {0: 0, 1: 0}, errors.OK),
        (1, {0: 143}, errors.FAILED),  # rank 1 SIGKILLed, rank 0 stopped by torch.distributed.run: a crash
        (1, {0: errors.USAGE, 1: 143}, errors.USAGE),  # a user error is not retried
        (1, {0: errors.SETUP, 1: errors.INTERNAL}, errors.SETUP),
        (0, {0: 0}, errors.OK),  # torch.distributed.run exits 0 only when every rank did (a lost line is no crash)
        (errors.SETUP, {}, errors.SETUP),  # torch's launcher itself could not start: a broken torch
    ],
)
def test_the_runs_exit_code_is_what_the_ranks_said(code, exits, expected):
    assert launcher.outcome(code, exits) == expected


def test_the_relay_copies_whole_lines_and_keeps_each_ranks_exit_code(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read_end, write_end = os.pipe()
    relay = Relay(fifo, write_end)
    relay.start()
    ranks = [os.open(fifo, os.O_WRONLY) for _ in range(2)]
    for rank, fd in enumerate(ranks):
        os.write(fd, json.dumps({"rank": rank, "seq": 1}).encode() + b"\n")
        os.write(fd, (heartbeat.exit_line(rank, rank * errors.USAGE) + "\n").encode())
        os.close(fd)
    relay.stop()
    os.close(write_end)
    lines = os.read(read_end, 65536).decode().splitlines()
    os.close(read_end)
    assert sorted(json.loads(line)["rank"] for line in lines if line.startswith("{")) == [0, 1]
    said = sorted(heartbeat.parse_exit(line) for line in lines if not line.startswith("{"))
    assert said == [(0, errors.OK), (1, errors.USAGE)]  # relayed: the supervisor knows the ranks end
    assert relay.exits == {0: errors.OK, 1: errors.USAGE} and not relay.is_alive()  # and kept for the outcome


def test_success_is_every_rank_of_this_node_ending_its_training_whatever_torchs_launcher_says():
    assert launcher.outcome(0, {}) == errors.OK
    # the agent that did not host the rendezvous' store exits 1 at the end (DistNetworkError): training is done
    assert launcher.outcome(RENDEZVOUS_FAILED, {2: 0, 3: 0}, ranks=2) == errors.OK
    assert launcher.outcome(1, {2: 0}, ranks=2) == errors.FAILED  # rank 3 said nothing: it died
    assert launcher.outcome(1, {2: 0, 3: 1}, ranks=2) == errors.FAILED
    assert launcher.outcome(1, {2: errors.USAGE, 3: 1}, ranks=2) == errors.USAGE


def test_a_stop_reaches_torchs_agent_once_however_often_it_comes(tmp_path):
    """SLURM's scancel signals every process of the step, the supervisor's kill signals the launcher too: torch's
    agent gets one SIGTERM, so its wait for its ranks (and their saves) is not cut short by the next."""
    import threading

    count = tmp_path / "sigterms"
    code = (
        "import signal, sys, time\n"
        f"def on(s, f): open({str(count)!r}, 'a').write('x')\n"
        "signal.signal(signal.SIGTERM, on)\n"
        "print('ready', flush=True)\n"
        "time.sleep(3)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert agent.stdout.readline().strip() == "ready"
    relay = types.SimpleNamespace(forget_path=lambda: None, heard=False)
    for delay in (0.2, 0.6, 1.0):  # three stops, as scancel's and the supervisor's may come
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM)).start()
    code, stopped = launcher._wait(agent, start=None, relay=relay, rdzv=None)
    assert stopped == signal.SIGTERM and code == 0
    assert count.read_text() == "x"  # forwarded once


def test_min_max_nodes_go_on_after_the_last_call_and_a_node_in_a_later_round_makes_this_one_regroup(tmp_path):
    """--nnodes 1:3: torch's agent gets MIN:MAX and a last call of --rdzv-timeout inside a join timeout twice that
    (or the join timeout would fire first). A node that opens a later round while this node's ranks train (it came
    back) makes this node's launcher stop torch's agent and end with REGROUP; not while no rank runs yet (it waits
    in the rendezvous), and not for its own round."""
    spec = node_spec(tmp_path, node=0, count=3, round_number=2)
    spec = spec.with_changes(nodes=replace(spec.nodes, minimum=1))
    clock = Clock()
    rdzv = NodeRendezvous(spec, quiet(), clock=clock)
    cmd = rdzv.command("spec.json", 2, "torchrun.log")
    flags = dict(zip(*[iter(cmd[cmd.index("--nnodes") : -3])] * 2))
    assert flags["--nnodes"] == "1:3" and flags["--rdzv-conf"] == "join_timeout=200,is_host=1,last_call_timeout=100"
    join_round(spec.paths, "fast", after=1)
    mark_round_started(spec.paths, 2)
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rdzv._regroup(agent)  # round 2 is this node's own
        assert agent.poll() is None and rdzv.regroup is None
        join_round(spec.paths.for_node(1), "fast")  # node 1 comes back: round 2 runs, so it opens round 3
        assert rdzv.wait(agent, heard=lambda: True) == -signal.SIGTERM
    finally:
        agent.kill()
    assert rdzv.regroup == 3


def test_a_node_whose_supervisor_stopped_counting_is_gone_and_one_that_counts_is_not(tmp_path):
    from rocm_yolo.run.nodes import lost_nodes, say_alive

    spec = node_spec(tmp_path, node=0, count=3)
    paths = spec.paths
    say_alive(paths.for_node(1), 5)  # node 1 counted once, and never again; node 2 never did
    clock = Clock()

    def sleep(dt: float) -> None:
        clock.now += dt

    assert lost_nodes(paths, spec.nodes, clock, sleep, wait=15.0) == [1, 2] and clock.now >= 1015.0
    ticks = iter(range(6, 100))

    def sleep_while_node_1_counts(dt: float) -> None:
        clock.now += dt
        say_alive(paths.for_node(1), next(ticks))

    assert lost_nodes(paths, spec.nodes, clock, sleep_while_node_1_counts, wait=15.0) == [2]


def test_a_rendezvous_port_someone_else_listens_on_stops_the_host_node_in_one_line(tmp_path):
    """Another process listens on the endpoint's port (here on 127.0.0.1 only, as a stranger's store might): node 0,
    which hosts the store, refuses in one line before torch's agent could become a client of theirs."""
    import socket

    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    try:
        spec = node_spec(tmp_path)
        spec = spec.with_changes(nodes=spec.nodes.at_port(port))
        with pytest.raises(errors.SetupError) as refused:
            NodeRendezvous(spec, quiet()).command("spec.json", 2, "torchrun.log")
        line = str(refused.value)
        assert "\n" not in line and f"port {port} is taken" in line and "--rdzv-endpoint" in line
        other = spec.with_changes(nodes=Nodes(3, 1, f"head:{port}", 100.0))
        assert "is_host=0" in " ".join(NodeRendezvous(other, quiet()).command("spec.json", 2, "t.log"))
    finally:
        stranger.close()
    assert rendezvous.port_holder(port) is None  # free again: node 0 hosts


def test_on_one_machine_the_ranks_collectives_use_the_loopback_interface_unless_the_user_named_one():
    lo = launcher.loopback_interface()
    assert lo and launcher.loopback_only({}) == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
    assert launcher.loopback_only({"NCCL_SOCKET_IFNAME": "eth0"}) == {}  # what the user says wins, for both
    assert launcher.loopback_only({"GLOO_SOCKET_IFNAME": "ib0"}) == {}
