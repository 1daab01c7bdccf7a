"""End to end, more than one machine: two "nodes" on this machine, each a supervisor of its own, meeting at torch's
c10d rendezvous on 127.0.0.1 and training one run in one shared run directory.

Each node is ``rocm-yolo train --device 0,1 --nnodes 2 --node-rank K --rdzv-endpoint 127.0.0.1:PORT`` (or the
same command with SLURM's variables and no node flags): two CPU ranks through the DDP seam in ``tests/seams``,
so four ranks, their fork servers and workers, all real. Nothing else is faked: the rendezvous, the agents of
``torch.distributed.run``, gloo between the nodes' ranks, real hangs and SIGKILLs, each node's supervisor
restarting its own tree. Two cases run by default (a clean run with ``status``, and a worker hang on node 1);
the others are marked ``multinode`` (``python -m pytest -m multinode``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import TAG_VAR, Cli, epochs_in, wait_for, with_cpu_ranks
from rocm_yolo import errors
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.nodes import Round, read_round
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import latest_spec

# 32 train images, batch 8 on 2 nodes x 2 ranks: 2 images a rank, 4 batches an epoch
NODE = ["--model", "yolo26n.yaml", "--device", "0,1", "--imgsz", "32", "--batch", "8", "plots=False"]
# Two nodes of two ranks each: four trainings at once on what may be a 2-core machine with another suite beside it.
# At 10 s, node 0 once called the end of a finished training a hang there (its ranks in validation and gc for 10 s).
WATCH = ["--stall-timeout", "20", "--startup-grace", "120", "--workers", "1", "prefetch_factor=1"]


@pytest.fixture(scope="module")
def data32(tmp_path_factory) -> Path:
    return write_demo(tmp_path_factory.mktemp("data") / "tiny32", train=32, val=8, size=64)


@pytest.fixture
def cli(cli):  # conftest's, which stops whatever a test left running
    return with_cpu_ranks(cli)


def free_port(low: int = 15000, high: int = 30000) -> int:
    """A port for the rendezvous, free now, below the ephemeral range (the SLURM case derives one in it)."""
    for port in range(low + os.getpid() % 5000, high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise AssertionError("no free port")


class TwoNodes:
    """Two supervisors of one run on this machine: node 0 and node 1, each with its own output."""

    def __init__(self, cli: Cli, run: Path, port: int, timeout: int = 120, nnodes: str = "2"):
        self.cli, self.run, self.port, self.timeout, self.nnodes = cli, run, port, timeout, nnodes
        self.outputs: dict[int, Path] = {}

    def flags(self, node: int) -> list[str]:
        endpoint = f"127.0.0.1:{self.port}"
        return [
            "--nnodes",
            self.nnodes,
            "--node-rank",
            str(node),
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-timeout",
            str(self.timeout),
        ]

    def start(self, node: int, *args: str, env: dict | None = None, flags: bool = True) -> subprocess.Popen:
        proc = self.cli.start(*args, *(self.flags(node) if flags else []), env=env)
        self.outputs[node] = self.cli.output
        return proc

    def train(self, data: Path, *args: str, env=None, flags=True) -> list[subprocess.Popen]:
        where = ["--project", str(self.run.parent), "--name", self.run.name]
        env = env or {}
        return [
            self.start(k, "train", str(data), *NODE, *where, *args, env=env.get(k, env.get(None)), flags=flags)
            for k in (0, 1)
        ]

    def out(self, node: int) -> str:
        return self.outputs[node].read_text(errors="replace")

    def wait(self, procs: list[subprocess.Popen], timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                self.cli.kill_all()
                raise AssertionError(
                    f"the nodes did not finish in {timeout} s:\n{self.out(0)[-3000:]}\n{self.out(1)[-3000:]}"
                )
        return [p.returncode for p in procs]

    def paths(self, node: int) -> RunPaths:
        return RunPaths(self.run, node)

    def node_events(self, node: int, kind: str) -> list[dict]:
        from rocm_yolo.run.events import read_events

        return [e for e in read_events(self.paths(node).events) if e["event"] == kind]


def node_processes(node: int) -> list[psutil.Process]:
    """The processes of one node's tree (they carry ROCM_YOLO_NODE), of this test's runs."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("ROCM_YOLO_NODE") == str(node) and TAG_VAR in proc.environ():
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def test_two_nodes_train_one_run_and_status_shows_every_node(cli, data32, tmp_path):
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port())
    procs = nodes.train(data32, "--epochs", "4", "--workers", "1")
    beat = {k: RunPaths(run, k).heartbeat for k in (0, 1)}
    wait_for(
        lambda: all(getattr(heartbeat.read(b), "epoch", 0) >= 2 for b in beat.values()), 240, "epoch 2", procs[0], cli
    )
    status = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "status", str(run), "--json"], capture_output=True, text=True, timeout=60
    )
    assert nodes.wait(procs, 300) == [0, 0], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    info = json.loads(status.stdout)
    assert [n["node"] for n in info["nodes"]] == [0, 1] and info["endpoint"] == f"127.0.0.1:{nodes.port}"
    for node in info["nodes"]:  # each node where its first rank was, and its other rank beside it
        assert node["epoch"] >= 2 and node["state"] == "running" and len(node["ranks"]) == 1, info
    assert epochs_in(run) == [1, 2, 3, 4] and checkpoints.verify(run / "weights" / "last.pt") is None
    for k in (0, 1):
        paths = nodes.paths(k)
        assert paths.spec(1).is_file() and paths.supervisor.is_file() and paths.log.is_file() and paths.lock.is_file()
        assert latest_spec(run, k).nodes.node == k and "done: 4 epochs" in nodes.out(k)
        assert "Traceback" not in nodes.out(k)
        # the agent that did not host the rendezvous' store loses it as the other exits: harmless, not on the terminal
        assert "recvVector failed" not in nodes.out(k) and "frame #" not in nodes.out(k)
    ranks = {e["rank"] for k in (0, 1) for e in nodes.node_events(k, "start_method") if "rank" in e}
    assert ranks == {0, 1, 2, 3}  # four ranks: the world size is the nodes' together
    assert read_round(RunPaths(run)) == Round(1, "fast", started=True)
    assert not (run / "rocm-yolo.log").exists()  # each node's log is its own
    text = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert "node 0:    finished" in text.stdout and "node 1:    finished" in text.stdout, text.stdout
    assert cli.leftovers() == []


def test_a_worker_hang_on_node_1_is_recovered_by_both_nodes_from_one_checkpoint(cli, data32, tmp_path):
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port())
    fault = {"ROCM_YOLO_FAULT": "worker-hang@2:1:n1"}  # a DataLoader worker of node 1's first rank blocks
    procs = nodes.train(
        data32, *WATCH, "--epochs", "2", "--checkpoint-every", "2ba", "--fallback", "fast,single", env={None: fault}
    )
    assert nodes.wait(procs, 400) == [0, 0], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    assert epochs_in(run) == [1, 2] and cli.leftovers() == []
    [hang] = nodes.node_events(1, "hang")
    assert hang["epoch"] == 2
    stacks = nodes.paths(1).hang_stacks(1).read_text()
    assert stacks.count("(rank,") == 2 and "block_forever" in stacks  # node 1's ranks, and the stuck worker
    [restart] = nodes.node_events(1, "restart")  # node 1 restarted its own tree on the next profile, into round 2
    assert restart["profile"] == "single" and latest_spec(run, 1).nodes.round == 2
    # node 0's ranks failed in the collectives of node 1's: it follows node 1 there, on its profile, with no cause of
    # its own diagnosed and no restart spent
    [follow] = nodes.node_events(0, "follow")
    assert follow["next_round"] == 2 and not nodes.node_events(0, "restart") and not nodes.node_events(0, "crash")
    assert latest_spec(run, 0).nodes.round == 2 and latest_spec(run, 0).profile == "single"
    assert read_round(RunPaths(run)) == Round(2, "single", started=True)
    resumed = [(e["rank"], e["epoch"], e["batch"]) for k in (0, 1) for e in nodes.node_events(k, "resumed")]
    assert sorted(r for r, _, _ in resumed) == [0, 1, 2, 3]  # every rank of both nodes resumed inside epoch 2 ...
    assert len({(epoch, batch) for _, epoch, batch in resumed}) == 1  # ... at the same batch, from one checkpoint
    assert resumed[0][1:] == (2, 2)
    assert checkpoints.verify(run / "weights" / "last.pt") is None


@pytest.mark.multinode
def test_a_node_that_stops_for_good_stops_every_node_at_once_with_its_exit_code_and_reason(cli, data32, tmp_path):
    """A rank of node 1 fails in its set-up with an internal error (``bug@setup``, node 1 only): node 1 stops (123)
    and says so in the run's shared folder; node 0, whose ranks fail with it, stops with the same code and a line
    naming node 1 and why, at its next restart or while it waits at the rendezvous: not after --rdzv-timeout."""
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port(), timeout=600)
    procs = nodes.train(data32, *WATCH, "--epochs", "2", env={1: {"ROCM_YOLO_FAULT": "bug@setup"}})
    assert nodes.wait(procs, 300) == [errors.INTERNAL, errors.INTERNAL], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    stop = read_round(RunPaths(run)).stopped
    assert (stop.node, stop.exit_code) == (1, errors.INTERNAL) and "injected bug" in stop.reason, stop
    [told] = nodes.node_events(1, "node_stop")
    assert told["exit_code"] == errors.INTERNAL and told["path"] == str(RunPaths(run).round)
    [line] = [x for x in nodes.out(0).splitlines() if "stopped for good" in x]
    assert line.startswith("rocm-yolo: node 1 of 2 stopped for good (exit 123: internal error: ") and "injected" in line
    assert f"--resume {RunPaths(run).last} and the same node flags, on every node" in line
    [failed] = nodes.node_events(0, "failed")
    assert failed["exit_code"] == errors.INTERNAL and not nodes.node_events(0, "nodes_missing")
    assert "Traceback" not in nodes.out(0) and cli.leftovers() == []


@pytest.mark.multinode
def test_node_1s_supervisor_sigkilled_then_started_again_with_resume(cli, data32, tmp_path):
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port())
    procs = nodes.train(data32, *WATCH, "--epochs", "4")
    beat = RunPaths(run, 1).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "epoch", 0) >= 2, 240, "epoch 2 on node 1", procs[1], cli)
    assert node_processes(1)  # node 1's launcher, torch's agent, its ranks, fork servers, workers
    procs[1].send_signal(signal.SIGKILL)  # node 1's supervisor gets no chance to clean up
    procs[1].wait()
    wait_for(lambda: not node_processes(1), 30, "node 1's tree to die with its supervisor")
    wait_for(lambda: any(e["round"] == 2 for e in nodes.node_events(0, "ddp_launch")), 120, "node 0 in round 2")
    assert procs[0].poll() is None  # node 0 restarted its own tree and waits for node 1 at the rendezvous
    again = nodes.start(1, "train", "--resume", str(run))
    assert nodes.wait([procs[0], again], 400) == [0, 0], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    assert epochs_in(run) == [1, 2, 3, 4] and cli.leftovers() == []
    # node 0's ranks failed in the all-reduce for node 1's loss: said as such, no cause of its own, no restart spent
    assert [e["nodes"] for e in nodes.node_events(0, "node_lost")] == [[1]] and nodes.node_events(0, "rejoin")
    assert not nodes.node_events(0, "crash") and not nodes.node_events(0, "restart")
    assert latest_spec(run, 0).nodes.round == latest_spec(run, 1).nodes.round == 2
    assert "done: epochs" in nodes.out(1) and "done: 4 epochs" in nodes.out(0)


@pytest.mark.multinode
def test_a_node_that_never_comes_back_ends_the_other_with_one_line_naming_it(cli, data32, tmp_path):
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port(), timeout=20)
    procs = nodes.train(data32, *WATCH, "--epochs", "4")
    beat = RunPaths(run, 1).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "epoch", 0) >= 2, 240, "epoch 2 on node 1", procs[1], cli)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    assert nodes.wait([procs[0]], 180) == [1]
    lines = [line for line in nodes.out(0).splitlines() if line.startswith("rocm-yolo:")]
    assert lines[-1].startswith(
        f"rocm-yolo: node 1 of 2 did not come to the rendezvous at 127.0.0.1:{nodes.port} within 20 s (round 2)"
    ), lines[-3:]
    assert f"--resume {run}" in lines[-1] and "Traceback" not in nodes.out(0)
    assert cli.leftovers() == []


@pytest.mark.multinode
def test_slurms_variables_form_the_job_with_no_node_flags(cli, data32, tmp_path):
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, 0)
    slurm = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_JOB_ID": "12345"}
    env = {k: {**slurm, "SLURM_NODEID": str(k)} for k in (0, 1)}
    procs = nodes.train(data32, "--epochs", "2", "--workers", "0", env=env, flags=False)
    assert nodes.wait(procs, 300) == [0, 0], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    assert epochs_in(run) == [1, 2] and cli.leftovers() == []
    port = read_round(RunPaths(run, 0)).port  # the run's own, drawn when the nodes first met: not the job id's
    assert port is not None
    for k in (0, 1):
        found = latest_spec(run, k).nodes
        assert (found.count, found.node, found.endpoint, found.source) == (2, k, f"127.0.0.1:{port}", "SLURM")


def alone_on_node_0(nodes: TwoNodes) -> bool:
    """Node 0 trains the run's four ranks on its own two GPUs (``--nnodes 1:2``, node 1 gone)."""
    beat = heartbeat.read(nodes.paths(0).heartbeat)
    return beat is not None and beat.world == 2 and beat.phase == "train" and beat.batches_total > 0


@pytest.mark.multinode
def test_with_nnodes_1_2_a_node_gone_for_good_leaves_the_other_to_finish_the_run_exactly(cli, data32, tmp_path):
    """``--nnodes 1:2``: node 1's supervisor SIGKILLed in epoch 2 (its tree dies with it) and never started again.
    Node 0's ranks fail in the all-reduce; node 0 sees node 1 gone (its supervisor no longer answers), spends no
    restart and diagnoses nothing, waits --rdzv-timeout at the rendezvous, then trains the run's four ranks on its
    own two GPUs (two micro-batches each a step, the run's accumulate) from the newest checkpoint, to the end."""
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port(), timeout=20, nnodes="1:2")
    procs = nodes.train(data32, *WATCH, "--epochs", "4", "--checkpoint-every", "2ba")
    beat = RunPaths(run, 1).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "epoch", 0) >= 2, 240, "epoch 2 on node 1", procs[1], cli)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    assert nodes.wait([procs[0]], 400) == [0], nodes.out(0)[-4000:]
    assert epochs_in(run) == [1, 2, 3, 4] and cli.leftovers() == []
    [lost] = nodes.node_events(0, "node_lost")
    assert lost["nodes"] == [1] and lost["round"] == 1
    assert not nodes.node_events(0, "restart") and not nodes.node_events(0, "crash")  # no restart, no cause
    [rejoin] = nodes.node_events(0, "rejoin")
    assert rejoin["round"] == 2
    laid = [e for e in nodes.node_events(0, "relayout") if e.get("rank", 0) == 0]
    assert [(e["world_from"], e["world_to"], e["micro_batches"], e["accumulate"]) for e in laid] == [(4, 2, 2, 8)]
    state = json.loads(nodes.paths(0).supervisor.read_text())
    assert state["restarts"] == 0 and state["state"] == "finished"
    line = [x for x in nodes.out(0).splitlines() if "node 1 of 2 is gone" in x]
    assert line and "the run goes on with the 1 left (--nnodes 1:2)" in line[0], nodes.out(0)[-3000:]
    assert "Traceback" not in nodes.out(0) and "NCCL_P2P_DISABLE" not in nodes.out(0)
    status = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True)
    assert status.returncode == 0 and "nodes:" in status.stdout


@pytest.mark.multinode
def test_with_nnodes_1_2_a_node_that_comes_back_joins_at_the_next_round_and_the_world_grows_back(cli, data32, tmp_path):
    """As above, then node 1 is started again with ``--resume RUN`` and its node flags while node 0 trains alone:
    it opens the next round, node 0's ranks stop to meet it there (no restart spent), and both finish the run on
    the four ranks of its layout again, every epoch once."""
    run = tmp_path / "runs" / "mn"
    nodes = TwoNodes(cli, run, free_port(), timeout=20, nnodes="1:2")
    procs = nodes.train(data32, *WATCH, "--epochs", "8", "--checkpoint-every", "2ba")
    beat = RunPaths(run, 1).heartbeat
    wait_for(lambda: getattr(heartbeat.read(beat), "epoch", 0) >= 2, 240, "epoch 2 on node 1", procs[1], cli)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    wait_for(lambda: alone_on_node_0(nodes), 240, "node 0 training alone", procs[0], cli)
    again = nodes.start(1, "train", "--resume", str(run))
    assert nodes.wait([procs[0], again], 600) == [0, 0], nodes.out(0)[-4000:] + nodes.out(1)[-3000:]
    assert epochs_in(run) == list(range(1, 9)) and cli.leftovers() == []
    [regroup] = nodes.node_events(0, "regroup")
    rejoins = nodes.node_events(0, "rejoin")
    assert [e["round"] for e in rejoins] == [2, regroup["next_round"]] and regroup["next_round"] == 3
    assert json.loads(nodes.paths(0).supervisor.read_text())["restarts"] == 0
    last = heartbeat.read(nodes.paths(0).heartbeat)
    assert last.world == 4 and last.attempt == rejoins[-1]["attempt"]  # the four ranks again, in round 3
    assert "done:" in nodes.out(1) and "done:" in nodes.out(0)


@pytest.mark.multinode
def test_a_rendezvous_port_another_process_holds_stops_the_host_node_in_one_line_and_the_other_with_it(
    cli, data32, tmp_path
):
    """Someone listens on the endpoint's port first (a store of theirs, whose contents every agent would unpickle):
    node 0, which hosts the rendezvous (is_host=1), says so in one line and stops (a setup error, never retried);
    node 1 stops with it instead of waiting out --rdzv-timeout (issue 45)."""
    run = tmp_path / "runs" / "mn"
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    try:
        nodes = TwoNodes(cli, run, port, timeout=120)
        procs = nodes.train(data32, *WATCH, "--epochs", "1")
        codes = nodes.wait(procs, 240)
    finally:
        stranger.close()
    assert codes == [errors.SETUP, errors.SETUP], nodes.out(0)[-3000:] + nodes.out(1)[-3000:]
    [line] = [x for x in nodes.out(0).splitlines() if f"port {port} is taken" in x]
    assert line.startswith("rocm-yolo: ") and "another process listens on it" in line
    assert "Traceback" not in nodes.out(0) + nodes.out(1) and cli.leftovers() == []
    assert not (run / "weights").exists() or not list((run / "weights").iterdir())  # no rank trained
