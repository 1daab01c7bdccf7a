"""Restarts: what the next attempt starts from, and the work each one loses (scripted heartbeats, real files)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from fakes import Clock, ScriptedChild, beat, supervisor
from helpers import fake_checkpoint, prepare
from rocm_yolo.run.supervisor_state import read_state
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.recovery import RecoveryTracker
from rocm_yolo.supervisor.restart import next_spec


def test_restarts_and_resumes_start_from_the_users_request_not_from_a_profiles_cut(tiny_data, tmp_path):
    """safe halves the workers the user asked for, once (not again on every restart or resume); a loader
    setting of the user's follows the run onto a profile that can take it, and is dropped on one that cannot."""
    spec = prepare(str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", workers=4, **{"prefetch_factor": 8})
    assert spec.workers_requested == 4 and "prefetch_factor" in spec.user_keys
    ladder = ("fast", "safe")
    second = next_spec(spec, ladder)
    third = next_spec(second, ladder)  # the last rung repeats
    cpus = os.cpu_count() or 1
    assert second.profile == third.profile == "safe"
    assert second.loader.workers == third.loader.workers == min(2, cpus)  # half of 4, both times
    assert "prefetch_factor" in second.user_keys and second.loader.prefetch_factor == 8  # the user's, not safe's 2
    single = next_spec(second, ("safe", "single"))
    assert "prefetch_factor" not in single.user_keys and single.loader.prefetch_factor is None  # no workers
    second.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    resumed = prepare(resume=str(Path(spec.run_dir) / "weights" / "last.pt"))  # no usage error
    assert resumed.profile == "safe" and resumed.loader.workers == min(2, cpus) and resumed.workers_requested == 4


CONFIG = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=2, poll_interval=1)


def at(seq, epoch, batch, total, *, phase="train", pid=100, t=0.0):
    """A heartbeat at ``batch`` of ``epoch`` (24 batches an epoch), ``total`` batches into its attempt."""
    return beat(seq, epoch=epoch, batch=batch, batches_total=total, batches=24, phase=phase, pid=pid, t=t, it_s=10.0)


def test_work_lost_per_restart_is_measured_from_heartbeats():
    work = RecoveryTracker()
    work.observe(at(1, 2, 14, 38, t=50))
    work.failed("hang", now=60, detect_seconds=10)
    first = at(1, 2, 11, 1, t=1090)  # the trainer's clock: retraining is timed by it, restarts by the supervisor's
    work.observe(first)
    record = work.resumed(first, attempt=2, checkpoint="ep2-ba10.pt", now=90)
    assert record.resumed_at == [2, 10] and record.retrained_batches == 4 and record.restart_seconds == 30
    assert work.observe(at(2, 2, 13, 3, t=1091)) is None  # not back yet
    done = work.observe(at(3, 2, 14, 4, t=1092))
    assert done is record and record.retrain_seconds == 2
    work.observe(at(4, 2, 24, 14, t=1095))
    work.observe(at(5, 2, 3, 14, phase="val", t=1096))  # validation: epoch 2's training is done
    work.failed("crash", now=97)
    again = work.resumed(at(1, 3, 1, 1), attempt=3, checkpoint="last.pt", now=100)
    assert again.lost_at == [2, 24] and again.resumed_at == [3, 0] and again.retrained_batches == 0


def test_the_watchdog_resumes_from_the_mid_epoch_checkpoint_and_reports_the_work_lost(spec):
    clock = Clock()
    paths = spec.paths
    fake_checkpoint(paths.last, age=100)
    fake_checkpoint(paths.mid_checkpoint(2, 10))
    hung = ScriptedChild(clock, {5: at(1, 2, 8, 8), 6: at(2, 2, 14, 14)}, pid=100)
    beats = {100 + k: at(k, 2, 10 + k, k, pid=101, t=100 + k) for k in range(1, 15)}
    healthy = ScriptedChild(clock, beats, pid=101, exit_at=130)
    made = []
    result = supervisor(spec, [hung, healthy], clock, CONFIG, made).run()
    assert made[1].resume == str(paths.mid_checkpoint(2, 10))
    [record] = result.recoveries
    assert record.cause == "hang" and record.lost_at == [2, 14] and record.resumed_at == [2, 10]
    assert record.retrained_batches == 4 and record.retrain_seconds == 3  # batch 14 again at t=104
    assert record.checkpoint == "ep2-ba10.pt"
    detect, restart = result.hangs[0].stalled_seconds, record.restart_seconds
    assert result.lost_seconds == pytest.approx(detect + restart + 3, abs=1.5)
    assert read_state(spec.run_dir).recoveries == [record]
    assert paths.mid_checkpoints() == [] and paths.last.exists()  # a finished run keeps no mid-epoch files


def test_a_resume_that_finishes_between_two_polls_still_says_where_it_resumed(spec):
    """The rest of the epoch, validation and the end can all come down the pipe between two polls
    (a short rest, fast batches): the supervisor reads every record, not only the newest."""
    clock = Clock()
    fake_checkpoint(spec.paths.mid_checkpoint(2, 10))
    hung = ScriptedChild(clock, {5: at(1, 2, 8, 8), 6: at(2, 2, 14, 14)}, pid=100)
    rest = [at(k, 2, 10 + k, k, pid=101) for k in range(1, 15)] + [
        at(15, 2, 3, 14, phase="val", pid=101),
        at(16, 2, 3, 14, phase="done", pid=101),
    ]
    times = [100.5 + k / 10 for k in range(len(rest))]  # a batch every 0.1 s: ten between two polls
    beats = {t: dataclasses.replace(hb, time=t) for t, hb in zip(times, rest)}
    fast = ScriptedChild(clock, beats, pid=101, exit_at=times[-1])
    [record] = supervisor(spec, [hung, fast], clock, CONFIG).run().recoveries
    assert record.resumed_at == [2, 10] and record.retrained_batches == 4 and record.cause == "hang"
    assert record.retrain_seconds == 0.3  # batch 11 to 14 again, by the trainer's clock, not the polls


def test_where_a_hang_stopped_is_the_last_finished_batch_not_the_last_record(tmp_path):
    """Records go at most once a second; every finished batch still reaches the supervisor (a position line),
    so the work a restart trains again is exact on a fast machine too."""
    from rocm_yolo.supervisor.trainer_process import PipeReader
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter

    read_end, write_end = os.pipe()
    writer = HeartbeatWriter(tmp_path / "heartbeat.json", pipe_fd=write_end, clock=lambda: 0.0)  # one second never ends
    trainer = type("T", (), {"epoch": 1, "epochs": 3, "train_loader": [None] * 50})()
    writer.on_train_epoch_start(trainer)
    for _ in range(40):
        writer.on_train_batch_end(trainer)
    reader, work = PipeReader(read_end), RecoveryTracker()
    for hb in reader.read():
        work.observe(hb)
    assert work.at == [2, 40]  # the 40th batch of epoch 2, though the last full record was the first batch's
    work.failed("hang", now=10.0)
    resumed = dataclasses.replace(at(1, 2, 31, 1, pid=101, t=5.0), batches=50)  # from ep2-ba30: batch 31 first
    record = work.resumed(resumed, attempt=2, checkpoint="ep2-ba30.pt", now=20.0)
    assert record.lost_at == [2, 40] and record.resumed_at == [2, 30] and record.retrained_batches == 10
    os.close(write_end)
    reader.close()
