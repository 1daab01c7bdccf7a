"""The plumbing of a multi-GPU run, in-process: devices, the ranks' heartbeats as the supervisor reads them, faults
aimed at one rank or node, a rank's global world size, and the DistributedSampler's order replayed from inside a
pass (the DDP launcher's side: tests/unit/ddp)."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch

from rocm_yolo.policy import placement
from rocm_yolo.run import devices, heartbeat
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.supervisor.trainer_process import PipeReader
from rocm_yolo.testing import faults
from rocm_yolo.trainer.midepoch import sample_order
from rocm_yolo.trainer.rank import trainer_class


@pytest.mark.parametrize(
    "device, ids",
    [
        ("0,1", ["0", "1"]),
        ([0, 2], ["0", "2"]),
        (" 0, 1 ", ["0", "1"]),
        ("cuda:0,1", ["0", "1"]),  # as Ultralytics' parse_device reads them
        ("cuda:0,cuda:1", ["0", "1"]),
        ("cpu", []),
        (None, []),
        (0, ["0"]),
        ("-1,-1", []),
    ],
)
def test_the_gpus_a_device_argument_names(device, ids):
    assert devices.gpu_ids(device) == ids
    assert devices.world_size({"device": device}) == max(len(ids), 1)


def test_a_batch_must_divide_by_the_gpus():
    assert placement.check_batch(8, ["0", "1"]) is None and placement.check_batch(5, ["0"]) is None
    assert "does not divide by the 2 GPUs" in placement.check_batch(5, ["0", "1"])
    assert "the default batch 16 does not divide by the 3 GPUs" in placement.check_batch(16, ["0", "1", "2"], "default")
    assert "AutoBatch" in placement.check_batch(-1, ["0", "1"]) and "AutoBatch" in placement.check_batch(
        0.7, ["0", "1"]
    )


def test_a_rank_knows_itself_from_torch_distributed_run():
    assert devices.rank({}) is None
    assert devices.rank({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}) == 1


def test_the_supervisors_reader_keeps_the_exit_lines_apart_from_the_records():
    read_end, write_end = os.pipe()
    reader = PipeReader(read_end)
    record = dict(seq=1, pid=10, attempt=1, phase="train", epoch=1, epochs=2, batch=1, batches=4, step_max=0.1)
    record.update(step_last=0.1, batches_total=1, it_s=1.0, time=1.0, started=0.0, rank=1, local_rank=1)
    text = "\n".join([heartbeat.exit_line(0, 143), json.dumps(record), "X 1 nonsense"])
    os.write(write_end, text.encode() + b"\n")
    os.close(write_end)
    beats = reader.read()
    reader.close()
    assert [hb.rank for hb in beats] == [1] and reader.exits == {0: 143}


def test_position_lines_move_rank_0s_record_only():
    read_end, write_end = os.pipe()
    reader = PipeReader(read_end)
    base = dict(
        seq=1, pid=10, attempt=1, phase="train", epoch=1, epochs=2, batch=1, batches=4, step_max=0.1, step_last=0.1
    )
    base.update(batches_total=1, it_s=1.0, time=1.0, started=0.0)
    zero, one = dict(base, rank=0), dict(base, pid=11, seq=5, batch=3, rank=1)
    old = {k: v for k, v in base.items()}  # a record of a version before multi-GPU runs: rank 0
    text = "\n".join([json.dumps(zero), json.dumps(one), heartbeat.position_line(2, 1, 2, 2, 2.0), json.dumps(old)])
    os.write(write_end, text.encode() + b"\n")
    beats = reader.read()
    assert [(b.rank, b.batch) for b in beats] == [(0, 1), (1, 3), (0, 2), (0, 1)]
    assert beats[2].pid == 10  # the position line moved rank 0's record, not rank 1's newer one
    os.close(write_end)
    reader.close()


def test_a_fault_aimed_at_a_rank_fires_there_only(tmp_path, monkeypatch):
    [fault] = faults.parse("worker-hang@2:1:1")
    assert (fault.epoch, fault.batch, fault.rank) == (2, 1, 1)
    assert faults.parse("kill@1:3")[0].rank is None
    with pytest.raises(ValueError, match="EPOCH:BATCH"):
        faults.parse("kill@1:x:1")
    paths = RunPaths(tmp_path / "run")
    paths.state.mkdir(parents=True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    assert faults.Injector([fault], paths).faults == []  # rank 0 ignores rank 1's fault
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    injector = faults.Injector([fault], paths)
    assert injector.faults == [fault] and injector.trigger == paths.state / "fault-rank1.trigger"


def test_a_distributed_pass_is_replayed_from_the_epoch_it_was_drawn_with():
    inner = torch.utils.data.DistributedSampler(range(20), num_replicas=2, rank=1, shuffle=True, seed=0)
    sampler = sample_order.PassSampler(inner)
    assert sampler.distributed and sampler.generator is None
    inner.set_epoch(3)
    whole = list(sampler)
    saved = sampler.state_of(0)
    assert saved == {"epoch": 3}
    inner.set_epoch(4)  # Ultralytics moved on (or workers prefetched across set_epoch): the saved value counts
    sampler.resume_next_pass(saved, 4)
    assert list(sampler) == whole[4:]


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
    trainer = trainer_class(model, nodes=2)()
    assert trainer.world_size == 4 and trainer.ran == ["on_pretrain_routine_start"]  # Ultralytics: rank 0 only
    assert trainer.get_dataloader("train", 8, rank=-1) == ("train", 8, -1, "train")  # no process group here
    assert trainer.get_dataloader("train", 8, rank=0, mode="val") == ("train", 8, 0, "val")
    monkeypatch.setenv("RANK", "0")
    assert trainer_class(model)().ran == []


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
