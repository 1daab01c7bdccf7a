"""Restarts: what the next attempt starts from, and the work each one loses (scripted heartbeats, real files)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from helpers import fake_checkpoint
from rocm_yolo import launch
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.state import read_state
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.loop import Supervisor
from rocm_yolo.supervisor.restart import next_spec
from rocm_yolo.supervisor.worklost import WorkLost


def test_restarts_and_resumes_start_from_the_users_request_not_from_a_profiles_cut(tiny_data, tmp_path):
    """safe halves the workers the user asked for, once (not again on every restart or resume);
    a loader override made for one profile does not follow the run onto the next."""
    spec = launch.prepare(
        str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", workers=4, extra={"prefetch_factor": 8}
    )
    assert spec.workers_requested == 4 and "prefetch_factor" in spec.user_keys
    ladder = ("fast", "safe")
    second = next_spec(spec, ladder)
    third = next_spec(second, ladder)  # the last rung repeats
    cpus = os.cpu_count() or 1
    assert second.profile == third.profile == "safe"
    assert second.loader.workers == third.loader.workers == min(2, cpus)  # half of 4, both times
    assert "prefetch_factor" not in second.user_keys and second.loader.prefetch_factor == 2  # safe's own
    second.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    resumed = launch.prepare(resume=str(Path(spec.run_dir) / "weights" / "last.pt"))  # no usage error
    assert resumed.profile == "safe" and resumed.loader.workers == min(2, cpus) and resumed.workers_requested == 4


def beat(seq, epoch, batch, total, phase="train", pid=100, it_s=10.0, t=0.0):
    return Heartbeat(
        seq=seq,
        pid=pid,
        attempt=1,
        phase=phase,
        epoch=epoch,
        epochs=3,
        batch=batch,
        batches=24,
        step_max=0.1,
        step_last=0.1,
        batches_total=total,
        it_s=it_s,
        time=t,
        started=0,
    )


def test_work_lost_per_restart_is_measured_from_heartbeats():
    work = WorkLost()
    work.observe(beat(1, 2, 14, 38, t=50))
    work.failed("hang", now=60, detect_seconds=10)
    first = beat(1, 2, 11, 1, t=1090)  # the trainer's clock: retraining is timed by it, restarts by the supervisor's
    work.observe(first)
    record = work.resumed(first, attempt=2, checkpoint="ep2-ba10.pt", now=90)
    assert record["resumed_at"] == [2, 10] and record["retrained_batches"] == 4 and record["restart_seconds"] == 30
    assert work.observe(beat(2, 2, 13, 3, t=1091)) is None  # not back yet
    done = work.observe(beat(3, 2, 14, 4, t=1092))
    assert done is record and record["retrain_seconds"] == 2
    work.observe(beat(4, 2, 24, 14, t=1095))
    work.observe(beat(5, 2, 3, 14, phase="val", t=1096))  # validation: epoch 2's training is done
    work.failed("crash", now=97)
    again = work.resumed(beat(1, 3, 1, 1), attempt=3, checkpoint="last.pt", now=100)
    assert again["lost_at"] == [2, 24] and again["resumed_at"] == [3, 0] and again["retrained_batches"] == 0


class Scripted:
    """A fake child showing scripted heartbeats, then exiting or going silent."""

    def __init__(self, clock, beats, pid, exit_at=None):
        self.clock, self.beats, self.pid, self.exit_at = clock, sorted(beats.items()), pid, exit_at

    def poll(self):
        return 0 if self.exit_at is not None and self.clock() >= self.exit_at else None

    def heartbeats(self):
        """The scripted heartbeats due since the last call, as the pipe gives them."""
        due = [hb for t, hb in self.beats if t <= self.clock()]
        new, self.seen = due[getattr(self, "seen", 0) :], len(due)
        return new

    def dump_stacks(self, out):
        out.write_text("stacks")
        return out

    def kill(self):
        return []


def test_the_watchdog_resumes_from_the_mid_epoch_checkpoint_and_reports_the_work_lost(spec):
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    paths = spec.paths
    fake_checkpoint(paths.last, age=100)
    fake_checkpoint(paths.mid_checkpoint(2, 10))
    hung = Scripted(clock, {5: beat(1, 2, 8, 8), 6: beat(2, 2, 14, 14)}, pid=100)
    beats = {100 + k: beat(k, 2, 10 + k, k, pid=101, t=100 + k) for k in range(1, 15)}
    healthy = Scripted(clock, beats, pid=101, exit_at=130)
    children, made = [hung, healthy], []

    def factory(s, c):
        made.append(s)
        return children[len(made) - 1]

    config = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=2, poll_interval=1)
    sup = Supervisor(
        spec,
        config,
        child_factory=factory,
        clock=clock,
        sleep=lambda dt: now.__setitem__(0, now[0] + dt),
        log=RunLog(stream=open(os.devnull, "w")),
    )
    result = sup.run()
    assert made[1].resume == str(paths.mid_checkpoint(2, 10))
    [record] = result.recoveries
    assert record["cause"] == "hang" and record["lost_at"] == [2, 14] and record["resumed_at"] == [2, 10]
    assert record["retrained_batches"] == 4 and record["retrain_seconds"] == 3  # batch 14 again at t=104
    assert record["checkpoint"] == "ep2-ba10.pt"
    detect, restart = result.hangs[0]["stalled_seconds"], record["restart_seconds"]
    assert result.lost_seconds == pytest.approx(detect + restart + 3, abs=1.5)
    assert read_state(spec.run_dir)["recoveries"] == [record]
    assert paths.mid_checkpoints() == [] and paths.last.exists()  # a finished run keeps no mid-epoch files


def test_a_resume_that_finishes_between_two_polls_still_says_where_it_resumed(spec):
    """The rest of the epoch, validation and the end can all come down the pipe between two polls
    (a short rest, fast batches): the supervisor reads every record, not only the newest."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    fake_checkpoint(spec.paths.mid_checkpoint(2, 10))
    hung = Scripted(clock, {5: beat(1, 2, 8, 8), 6: beat(2, 2, 14, 14)}, pid=100)
    rest = [beat(k, 2, 10 + k, k, pid=101) for k in range(1, 15)] + [
        beat(15, 2, 3, 14, phase="val", pid=101),
        beat(16, 2, 3, 14, phase="done", pid=101),
    ]
    at = [100.5 + k / 10 for k in range(len(rest))]  # a batch every 0.1 s: ten between two polls
    fast = Scripted(clock, {t: dataclasses.replace(hb, time=t) for t, hb in zip(at, rest)}, pid=101, exit_at=at[-1])
    children = iter([hung, fast])
    config = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=2, poll_interval=1)
    sup = Supervisor(
        spec,
        config,
        child_factory=lambda s, c: next(children),
        clock=clock,
        sleep=lambda dt: now.__setitem__(0, now[0] + dt),
        log=RunLog(stream=open(os.devnull, "w")),
    )
    [record] = sup.run().recoveries
    assert record["resumed_at"] == [2, 10] and record["retrained_batches"] == 4 and record["cause"] == "hang"
    assert record["retrain_seconds"] == 0.3  # batch 11 to 14 again, by the trainer's clock, not the polls


def test_where_a_hang_stopped_is_the_last_finished_batch_not_the_last_record(tmp_path):
    """Records go at most once a second; every finished batch still reaches the supervisor (a position line),
    so the work a restart trains again is exact on a fast machine too."""
    import os

    from rocm_yolo.supervisor.child import PipeReader
    from rocm_yolo.trainer.heartbeat import HeartbeatWriter

    read_end, write_end = os.pipe()
    writer = HeartbeatWriter(tmp_path / "heartbeat.json", pipe_fd=write_end, clock=lambda: 0.0)  # one second never ends
    trainer = type("T", (), {"epoch": 1, "epochs": 3, "train_loader": [None] * 50})()
    writer.on_train_epoch_start(trainer)
    for _ in range(40):
        writer.on_train_batch_end(trainer)
    reader, work = PipeReader(read_end), WorkLost()
    for hb in reader.read():
        work.observe(hb)
    assert work.at == [2, 40]  # the 40th batch of epoch 2, though the last full record was the first batch's
    work.failed("hang", now=10.0)
    resumed = dataclasses.replace(beat(1, 2, 31, 1, pid=101, t=5.0), batches=50)  # from ep2-ba30: batch 31 first
    record = work.resumed(resumed, attempt=2, checkpoint="ep2-ba30.pt", now=20.0)
    assert record["lost_at"] == [2, 40] and record["resumed_at"] == [2, 30] and record["retrained_batches"] == 10
    os.close(write_end)
    reader.close()
