"""More than one machine: the job from the node flags or a scheduler's variables, SLURM's host lists, the run's port."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rocm_yolo.errors import UsageError
from rocm_yolo.request import cluster, schedulers
from rocm_yolo.request.cluster import DEFAULT_RENDEZVOUS_TIMEOUT
from rocm_yolo.run.nodes import Nodes


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node01", ["node01"]),
        ("node[01-04]", ["node01", "node02", "node03", "node04"]),
        ("a[1,3-5],b2", ["a1", "a3", "a4", "a5", "b2"]),
        ("gpu-[8-10]", ["gpu-8", "gpu-9", "gpu-10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # the padding of the range's first number
        ("nid[001-002]-ib", ["nid001-ib", "nid002-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x1,y[2-3],z", ["x1", "y2", "y3", "z"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
    ],
)
def test_slurm_host_lists_expand_as_scontrol_show_hostnames_does(nodelist, hosts):
    assert schedulers.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[01-04", "node01]", "a[x-3]", "a[5-3]", "a,,b", ""])
def test_a_host_list_that_cannot_be_read_is_refused(nodelist):
    with pytest.raises(ValueError):
        schedulers.expand_nodelist(nodelist)


def test_the_port_of_a_slurm_job_is_the_runs_own_drawn_once_and_the_same_on_every_node(tmp_path):
    """No port given: the job id (public: squeue) says nothing of it. The first node to join draws it, below the
    ephemeral range; every node, and every later round, gets the same one from the run's private round.json."""
    from rocm_yolo.run.nodes import OWN_PORTS, join_round, read_round
    from rocm_yolo.run.paths import RunPaths

    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "987654"}
    nodes = cluster.resolve(env=env)
    assert nodes.own_port and nodes.endpoint == f"n1:{cluster.DEFAULT_PORT}"  # until the nodes meet
    paths = RunPaths(tmp_path, 0)
    first = join_round(paths, "fast", own_port=nodes.own_port)
    assert first.port in OWN_PORTS and join_round(paths.for_node(1), "fast", own_port=True).port == first.port
    assert join_round(paths, "safe", after=1).port == first.port == read_round(paths).port  # a restart's round too
    assert (tmp_path / "rocm_yolo").stat().st_mode & 0o777 == 0o700  # round.json is the user's alone
    ports = {join_round(RunPaths(tmp_path / str(k), 0), "fast", own_port=True).port for k in range(20)}
    assert len(ports) > 1  # drawn, not derived: runs of the same job id get different ones
    flagged = cluster.resolve(env={**env, "MASTER_PORT": "23456"})
    assert not flagged.own_port and flagged.endpoint == "n1:23456"  # a port given is kept


def test_node_flags_form_the_job():
    nodes = cluster.resolve(2, 1, "node01:29400", "10m", env={})
    assert nodes == Nodes(count=2, node=1, endpoint="node01:29400", timeout=600.0, source="flags")
    assert cluster.resolve(4, "0", "[::1]:29400", None, env={}).endpoint == "[::1]:29400"
    assert cluster.resolve(2, 0, "h:1", 90, env={}).timeout == 90.0
    assert cluster.resolve(None, None, None, None, env={}) is None  # one machine
    assert cluster.resolve(1, 0, "h:1", None, env={}) is None  # --nnodes 1 is one machine


def test_slurm_forms_the_same_job_with_no_node_flags():
    env = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "987654"}
    nodes = cluster.resolve(env=env)
    assert (nodes.count, nodes.node, nodes.source, nodes.own_port) == (4, 2, "SLURM", True)
    assert nodes.endpoint.startswith("gpu07:") and nodes.timeout == DEFAULT_RENDEZVOUS_TIMEOUT
    older = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_NODELIST": "a[1,3]", "SLURM_JOBID": "5"}
    assert cluster.resolve(env=older).endpoint.startswith("a1:")
    # MASTER_ADDR and MASTER_PORT win when set, and a flag wins over everything
    assert cluster.resolve(env={**env, "MASTER_ADDR": "head", "MASTER_PORT": "23456"}).endpoint == "head:23456"
    assert cluster.resolve(env={**env, "MASTER_ADDR": "head"}).endpoint.startswith("head:")
    assert cluster.resolve(None, 3, "x:1", "30s", env=env) == Nodes(4, 3, "x:1", 30.0, "SLURM")
    assert cluster.resolve(env={**env, "SLURM_NNODES": "1"}) is None  # a job of one node
    assert cluster.resolve(1, env=env) is None  # --nnodes 1: this machine alone, inside a bigger allocation


def test_another_scheduler_is_one_more_backend_with_its_own_variables(monkeypatch):
    class Pbs:
        name = "PBS"

        def nodes(self, env):
            return int(env["PBS_NNODES"]) if "PBS_NNODES" in env else None

        def node(self, env):
            return 1

        def first_host(self, env):
            return "head"

    monkeypatch.setattr(cluster, "SCHEDULERS", (Pbs(), *schedulers.SCHEDULERS))
    found = cluster.resolve(env={"PBS_NNODES": "2"})
    assert found == Nodes(2, 1, f"head:{cluster.DEFAULT_PORT}", DEFAULT_RENDEZVOUS_TIMEOUT, "PBS", own_port=True)
    assert cluster.resolve(env={}) is None  # its variables say no job: one machine
    assert cluster.resolve(2, 0, env={}).endpoint.startswith("head:")  # the flags first, then the scheduler's host


@pytest.mark.parametrize(
    "args, env, says",
    [
        ((2,), {}, "--nnodes 2 needs --node-rank K, this machine's number from 0 to 1"),
        ((2, 2, "h:1"), {}, "--node-rank 2: the 2 nodes of --nnodes 2 are numbered 0 to 1"),
        ((2, -1, "h:1"), {}, "--node-rank -1: the 2 nodes"),
        ((0, 0, "h:1"), {}, "--nnodes 0: give the number of machines"),
        (("two",), {}, "--nnodes two: give a whole number"),
        ((2, 1), {}, "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        ((2, 1, "node01"), {}, "--rdzv-endpoint node01: write HOST:PORT"),
        ((2, 1, "node01:0"), {}, "--rdzv-endpoint node01:0: write HOST:PORT"),
        ((2, 1, ":29400"), {}, "write HOST:PORT"),
        ((2, 1, "h:1", "soon"), {}, "--rdzv-timeout soon: give how long"),
        ((2, 1, "h:1", "-5"), {}, "--rdzv-timeout -5"),
        ((None, 1), {}, "--node-rank needs --nnodes N"),
        ((None, None, "h:1"), {}, "--rdzv-endpoint needs --nnodes N"),
        ((None, None, None, 60), {}, "--rdzv-timeout is for more than one machine"),
        ((), {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST=n[1-"),
        ((), {"SLURM_NNODES": "2", "SLURM_NODEID": "5", "SLURM_JOB_NODELIST": "n1"}, "--node-rank 5: the 2 nodes"),
    ],
)
def test_flags_that_form_no_job_are_one_line_usage_errors(args, env, says):
    with pytest.raises(UsageError) as found:
        cluster.resolve(*args, env=env)
    assert says in str(found.value) and "\n" not in str(found.value)


def test_bad_node_flags_exit_2_in_one_line_and_leave_nothing(tmp_path):
    for flags in (
        ["--nnodes", "2"],
        ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--device", "cpu"],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "rocm_yolo", "train", "demo", *flags], cwd=tmp_path, capture_output=True, text=True
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("rocm-yolo: error:"), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_nnodes_min_max_is_torchs_form_and_a_fixed_count_stays_one():
    flags = {"node_rank": 0, "endpoint": "node01:29400", "env": {}}
    elastic = cluster.resolve("1:2", **flags)
    assert (elastic.count, elastic.minimum, elastic.elastic, elastic.nnodes) == (2, 1, True, "1:2")
    assert list(elastic.counts) == [1, 2] and "going on with 1 or more" in elastic.describe()
    fixed = cluster.resolve("2", **flags)
    assert (fixed.minimum, fixed.elastic, fixed.nnodes, list(fixed.counts)) == (None, False, "2", [2])
    same = cluster.resolve("2:2", **flags)  # MIN = MAX: a fixed count
    assert same.minimum is None and same.nnodes == "2"
    for bad in ("2:1", "0:2", "a:2", "1:", ":2", "1:2:3"):
        with pytest.raises(UsageError, match="MIN:MAX") as caught:
            cluster.resolve(bad, **flags)
        assert "\n" not in str(caught.value)


def test_every_round_an_elastic_run_may_have_must_keep_each_step_on_two_gpus_or_more():
    from rocm_yolo.policy.placement import check_rounds
    from rocm_yolo.run.devices import Layout

    check_rounds(Layout(4, 2), per_node=2, counts=range(1, 3), where="--nnodes 1:2")  # 2 or 4 GPUs: both fit
    with pytest.raises(UsageError, match=r"--nnodes 2:3: a round of 2 nodes \(4 GPUs\).*every round has 1, 2, 3, 6"):
        check_rounds(Layout(6, 4), per_node=2, counts=range(2, 4), where="--nnodes 2:3")
    with pytest.raises(UsageError, match="one rank alone"):
        check_rounds(Layout(2, 4), per_node=1, counts=range(1, 3), where="--nnodes 1:2")
