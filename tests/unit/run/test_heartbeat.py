"""The heartbeat record: written by the trainer's callbacks, parsed by the supervisor and ``status``."""

from __future__ import annotations

import json
import os

import pytest

from rocm_yolo.run import heartbeat
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.supervisor.trainer_process import PipeReader


def test_a_heartbeat_file_that_cannot_be_written_is_said_once_and_still_heard(tmp_path):
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter

    read_end, write_end = os.pipe()
    said = []
    writer = HeartbeatWriter(
        tmp_path / "missing" / "heartbeat.json", pipe_fd=write_end, on_error=said.append, clock=lambda: 0.0
    )  # no second passes: only the forced records
    reader = PipeReader(read_end)
    trainer = type("T", (), {"epoch": 0, "epochs": 1, "train_loader": [None] * 3})()
    writer.on_train_epoch_start(trainer)
    for _ in range(3):
        writer.on_train_batch_end(trainer)
    writer.on_train_end(trainer)
    beats = reader.read()
    # full records: the first batch forced, then at most one a second; every other batch as a position line
    assert [hb.phase for hb in beats] == ["setup", "train", "train", "train", "train", "done"]
    assert [hb.batch for hb in beats[1:5]] == [0, 1, 2, 3] and [hb.batches_total for hb in beats[2:5]] == [1, 2, 3]
    assert [hb.seq for hb in beats] == sorted({hb.seq for hb in beats}), "every record, in order"
    hb = beats[-1]
    assert hb.batches_total == 3 and hb.seq == writer.seq and reader.read() == []
    assert len(said) == 1 and "cannot write the heartbeat file" in said[0]
    os.close(write_end)
    reader.close()


def test_start_up_is_reported_step_by_step_until_the_first_trained_batch(tmp_path):
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter

    read_end, write_end = os.pipe()
    writer = HeartbeatWriter(tmp_path / "heartbeat.json", pipe_fd=write_end, clock=lambda: 0.0)
    reader = PipeReader(read_end)
    trainer = type("T", (), {"epoch": 0, "epochs": 1, "train_loader": [None] * 3})()
    writer.on_pretrain_routine_start(trainer)  # the data set checked and cached, the model and loaders built
    writer.on_train_epoch_start(trainer)  # the loader iterated for its first batch
    writer.on_train_batch_start(trainer)  # the batch came: the first step
    writer.on_train_batch_end(trainer)
    writer.on_train_batch_start(trainer)  # later batches say nothing of start-up
    writer.on_train_epoch_start(trainer)
    beats = reader.read()
    assert [hb.startup for hb in beats] == ["", heartbeat.DATA, heartbeat.FIRST_BATCH, heartbeat.FIRST_STEP, "", ""]
    assert set(heartbeat.STEPS) == {"", heartbeat.DATA, heartbeat.WORKERS, heartbeat.FIRST_BATCH, heartbeat.FIRST_STEP}
    os.close(write_end)
    reader.close()
    # spawned workers each import torch before the first batch: that wait is start-up, not the loader's
    read_end, write_end = os.pipe()
    spawned = HeartbeatWriter(tmp_path / "hb2.json", pipe_fd=write_end, clock=lambda: 0.0, spawned_workers=True)
    reader = PipeReader(read_end)
    spawned.on_train_epoch_start(trainer)
    assert reader.read()[-1].startup == heartbeat.WORKERS
    os.close(write_end)
    reader.close()


RECORD = {
    "seq": 3,
    "pid": 41,
    "attempt": 1,
    "phase": "train",
    "epoch": 2,
    "epochs": 3,
    "batch": 5,
    "batches": 16,
    "step_max": 0.25,
    "step_last": 0.2,
    "batches_total": 21,
    "it_s": 4.5,
    "time": 1700000000.5,
    "started": 1699999990.0,
}


def test_a_record_parses_into_a_heartbeat():
    hb = heartbeat.parse(json.dumps(RECORD))
    assert hb == Heartbeat(**RECORD)
    assert heartbeat.parse(json.dumps({**RECORD, "epoch": 2.0})).epoch == 2  # an integral float is an integer


@pytest.mark.parametrize(
    "change",
    [
        {"seq": True},  # a bool is not a number
        {"batch": 5.5},  # a fraction where an integer belongs
        {"phase": 3},
        {"it_s": "fast"},
        {"extra": 1},  # unknown key
    ],
)
def test_a_badly_typed_record_is_none_not_an_error(change):
    assert heartbeat.parse(json.dumps({**RECORD, **change})) is None


def test_half_a_record_or_no_record_is_none(tmp_path):
    text = json.dumps(RECORD)
    assert heartbeat.parse(text[: len(text) // 2]) is None and heartbeat.parse("") is None
    missing = {k: v for k, v in RECORD.items() if k != "seq"}
    assert heartbeat.parse(json.dumps(missing)) is None and heartbeat.parse("[1, 2]") is None
    assert heartbeat.read(tmp_path / "none.json") is None
    (tmp_path / "hb.json").write_text(text)
    assert heartbeat.read(tmp_path / "hb.json") == Heartbeat(**RECORD)


def test_the_pipe_gives_every_complete_record_and_keeps_a_partial_one(tmp_path):
    read_end, write_end = os.pipe()
    reader = PipeReader(read_end)
    one, two = json.dumps(RECORD), json.dumps({**RECORD, "seq": 4})
    os.write(write_end, (one + "\nnot json\n" + two[:10]).encode())
    assert [hb.seq for hb in reader.read()] == [3]
    os.write(write_end, (two[10:] + "\n").encode())
    assert [hb.seq for hb in reader.read()] == [4] and reader.read() == []
    os.close(write_end)
    assert reader.read() == [] and reader.fd == -1  # the writer closed: the reader closes its end
