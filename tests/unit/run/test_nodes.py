"""More than one machine, in the shared contract: each node's files, the spec's nodes, the round they agree on."""

from __future__ import annotations

import json

from rocm_yolo.policy import placement
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.run import devices
from rocm_yolo.run.heartbeat import parse
from rocm_yolo.run.nodes import (
    Nodes,
    NodeStop,
    Round,
    join_round,
    mark_round_started,
    read_round,
    record_stop,
    stopped_node,
)
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec, latest_spec, next_attempt


def test_each_node_keeps_its_own_files_and_shares_the_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("ROCM_YOLO_NODE", raising=False)
    one, node = RunPaths(tmp_path), RunPaths(tmp_path, 1)
    state = tmp_path / "rocm_yolo"
    assert one.node is None and node.node_dir == state / "node-1"
    for name in ("lock", "heartbeat", "supervisor", "events", "workers", "stacks", "torchrun_log", "ranks_fifo"):
        assert getattr(node, name) == state / "node-1" / getattr(one, name).name, name
    assert node.spec(3) == state / "node-1" / "spec-3.json" and node.heartbeat_of(3).name == "heartbeat-rank3.json"
    assert node.log == state / "node-1" / "rocm-yolo.log" and node.hang_stacks(2).parent == node.node_dir
    assert node.crash(2, 3) == state / "node-1" / "crash-2-rank3.txt" and one.crash(2) == tmp_path / "crash-2.txt"
    for name in ("last", "best", "results", "last_good", "tracker", "round", "round_lock"):
        assert getattr(node, name) == getattr(one, name), name  # the run's: every node sees the same
    assert node.fault_trigger_of(3) == one.fault_trigger_of(3) and node.fault_fired("kill") == one.fault_fired("kill")
    monkeypatch.setenv("ROCM_YOLO_NODE", "1")  # a process of node 1's tree (a DataLoader worker, the fork server)
    assert RunPaths(tmp_path) == node and RunPaths(tmp_path, None) == one
    node.node_dir.mkdir(parents=True)
    (state / "node-0").mkdir()
    (state / "node-x").mkdir()
    assert one.nodes() == [0, 1] and one.for_node(0) == RunPaths(tmp_path, 0)


def test_a_spec_carries_its_nodes_and_finds_its_nodes_files(tmp_path):
    r = resolve("fast", 2, cpu_count=4)
    nodes = Nodes(count=2, node=1, endpoint="node01:29400", timeout=90.0, source="SLURM", round=3)
    spec = RunSpec(
        data="d.yaml", model="m.yaml", run_dir=str(tmp_path), profile="fast", loader=r.loader, val=r.val,
        train_args={"device": "0,1"}, nodes=nodes, attempt=2,
    )  # fmt: skip
    again = RunSpec.from_json(spec.to_json())
    assert again == spec and again.node == 1 and again.paths == RunPaths(tmp_path, 1)
    spec.save()
    assert latest_spec(tmp_path, 1) == spec and latest_spec(tmp_path) is None  # one machine's is not there
    assert next_attempt(tmp_path, 1) == 3 and next_attempt(tmp_path, 0) == 1
    old = json.loads(spec.to_json())
    del old["nodes"]  # a spec of a version before more than one machine
    assert RunSpec.from_json(json.dumps(old)).nodes is None
    assert devices.world_size({"device": "0,1"}, nodes) == 4 and devices.world_size({"device": "0"}, nodes) == 2
    assert devices.launches_ranks({"device": "0"}, nodes) and not devices.launches_ranks({"device": "0"})


def test_the_batch_divides_by_every_gpu_of_every_node():
    assert placement.check_batch(16, ["0", "1"], nodes=4) is None
    why = placement.check_batch(12, ["0", "1"], nodes=4)
    assert "does not divide by the 8 GPUs of --device 0,1 on each of 4 nodes" in why and "batch=64" in why
    assert placement.check_batch(2, ["0"], nodes=2) is None and "divide" in placement.check_batch(3, ["0"], nodes=2)


def test_nodes_meet_in_the_round_the_others_wait_in_and_move_on_together(tmp_path):
    paths = RunPaths(tmp_path)
    assert read_round(paths) is None
    # a new run: the first node opens round 1 on the run's profile, the second joins it
    assert join_round(paths, "fast") == Round(1, "fast") == join_round(paths.for_node(1), "fast")
    mark_round_started(paths, 1)
    assert read_round(paths) == Round(1, "fast", started=True)
    # both fail in round 1: the first to restart opens round 2 on the next profile, the other joins it
    assert join_round(paths, "safe", after=1) == Round(2, "safe")
    assert join_round(paths.for_node(1), "safe", after=1) == Round(2, "safe")
    mark_round_started(paths, 2)
    mark_round_started(paths, 1)  # a late mark of an old round changes nothing
    assert read_round(paths) == Round(2, "safe", True)
    # node 1 is killed and started again with --resume while node 0 still trains in round 2: a new round,
    # which node 0 joins when its ranks fail, on the profile the resumed node brought (the run's)
    assert join_round(paths.for_node(1), "safe") == Round(3, "safe")
    assert join_round(paths, "threads", after=2) == Round(3, "safe")
    # a round that never started (the others wait in it) is joined by a resumed node, not skipped
    assert join_round(paths, "fast") == Round(3, "safe")
    # a node whose round failed before it started opens the next one after it
    assert join_round(paths, "single", after=3) == Round(4, "single")


def test_a_node_that_stops_for_good_says_so_in_the_round_and_a_users_start_opens_a_round_without_it(tmp_path):
    paths = RunPaths(tmp_path)
    join_round(paths, "fast")
    mark_round_started(paths, 1)
    stop = NodeStop(1, 123, "internal error: KeyError: 'x'")
    assert record_stop(paths.for_node(1), stop, 1, "fast") == stop
    assert read_round(paths) == Round(1, "fast", True, stop) and stopped_node(paths) == stop
    # node 0, stopping because node 1 did, says nothing new: the first stop stays
    assert record_stop(paths, NodeStop(0, 1, "a crash"), 1, "fast") == stop
    # a watchdog restart meets the stop (its caller stops); a late mark of a round keeps it
    assert join_round(paths, "safe", after=1) == Round(1, "fast", True, stop)
    mark_round_started(paths, 1)
    assert stopped_node(paths) == stop
    # the user starts every node again: the first opens a new round without the stop, the other joins it
    assert join_round(paths, "fast") == Round(2, "fast") == join_round(paths.for_node(1), "fast")
    assert stopped_node(paths) is None
    # a node stops while the others wait in a round that has not started: it is said in that round
    record_stop(paths.for_node(1), stop, 2, "fast")
    assert read_round(paths) == Round(2, "fast", False, stop)
    # without a round file (unreadable), the stop makes one
    paths.round.unlink()
    assert record_stop(paths, NodeStop(0, 4, "environment error: disk full"), 5, "safe").node == 0
    assert read_round(paths) == Round(5, "safe", True, NodeStop(0, 4, "environment error: disk full"))
    assert stop.describe(2) == "node 1 of 2 stopped for good (exit 123: internal error: KeyError: 'x')"


def test_a_damaged_round_file_is_no_round(tmp_path):
    paths = RunPaths(tmp_path)
    paths.state.mkdir()
    paths.round.write_text("{not json")
    assert read_round(paths) is None
    paths.round.write_text(json.dumps({"number": 0, "profile": "fast"}))
    assert read_round(paths) is None
    assert join_round(paths, "fast") == Round(1, "fast")


def test_local_rank_0_speaks_for_its_node_and_older_records_still_parse():
    record = {
        "seq": 1, "pid": 1, "attempt": 1, "phase": "train", "epoch": 1, "epochs": 2, "batch": 1, "batches": 4,
        "step_max": 0.1, "step_last": 0.1, "batches_total": 1, "it_s": 1.0, "time": 0.0, "started": 0.0,
    }  # fmt: skip
    assert parse(json.dumps(record)).lead  # one GPU
    assert not parse(json.dumps({**record, "rank": 1})).lead  # a multi-GPU run's rank 1, before local ranks
    assert parse(json.dumps({**record, "rank": 2, "local_rank": 0})).lead  # node 1's first rank
    assert not parse(json.dumps({**record, "rank": 3, "local_rank": 1})).lead
    assert devices.local_rank({"LOCAL_RANK": "1"}) == 1 and devices.local_rank({}) is None
