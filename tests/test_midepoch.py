"""Mid-epoch checkpoints without training: the interval, the sampler that replays a pass, the loop patch, the
choice of checkpoint on resume, and the work-lost records (real Ultralytics loaders, scripted heartbeats)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rocm_yolo import checkpoints, compat, launch, sample_order
from rocm_yolo.checkpoints import parse_interval
from rocm_yolo.errors import UsageError
from rocm_yolo.heartbeat import Heartbeat
from rocm_yolo.log import RunLog
from rocm_yolo.paths import RunPaths
from rocm_yolo.patches import trainloop
from rocm_yolo.profiles import resolve
from rocm_yolo.spec import RunSpec
from rocm_yolo.supervisor import Supervisor, WatchdogConfig, read_state
from rocm_yolo.worklost import WorkLost


# --------------------------------------------------------------------------- --checkpoint-every


@pytest.mark.parametrize("text, seconds, batches", [("10m", 600, None), ("30s", 30, None), ("1.5h", 5400, None),
                                                     ("500ba", None, 500), ("0", None, None), (0, None, None)])
def test_interval_forms(text, seconds, batches):
    interval = parse_interval(text)
    assert (interval.seconds, interval.batches) == (seconds, batches)
    assert interval.enabled == bool(seconds or batches)


@pytest.mark.parametrize("text", ["10x", "-1m", "m", "1.5ba", "10", "0ba", ""])
def test_bad_intervals_say_what_is_accepted(text):
    with pytest.raises(UsageError, match="write a time .* a number of batches .* or 0"):
        parse_interval(text)


@pytest.mark.parametrize("value", ["10x", "-1m"])
def test_cli_rejects_a_bad_interval_in_one_line_with_exit_2(value, tmp_path):
    r = subprocess.run([sys.executable, "-m", "rocm_yolo", "train", "demo", "--checkpoint-every", value],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"rocm-yolo: error: --checkpoint-every {value}: write a time (30s, 10m, 1.5h), a number of batches (500ba), "
        "or 0 to turn mid-epoch checkpoints off"]
    assert not (tmp_path / "runs").exists()  # nothing started, nothing claimed


def test_the_interval_travels_in_the_spec_and_a_resume_keeps_it(tiny_data, tmp_path):
    spec = launch.make_spec(str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", checkpoint_every="250ba")
    assert spec.checkpoint_every == "250ba"
    assert RunSpec.from_json(spec.to_json()).checkpoint_every == "250ba"
    spec.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    again = launch.make_spec(resume=str(Path(spec.run_dir) / "weights" / "last.pt"))
    assert again.checkpoint_every == "250ba"
    default = launch.make_spec(str(tiny_data), project=str(tmp_path), name="other", model="yolo26n.yaml")
    assert default.checkpoint_every == "10m"


def test_restarts_and_resumes_start_from_the_users_request_not_from_a_profiles_cut(tiny_data, tmp_path):
    """safe halves the workers the user asked for, once (not again on every restart or resume);
    a loader override made for one profile does not follow the run onto the next."""
    spec = launch.make_spec(str(tiny_data), project=str(tmp_path), model="yolo26n.yaml", workers=4,
                            extra={"prefetch_factor": 8})
    assert spec.workers_requested == 4 and "prefetch_factor" in spec.user_keys
    supervisor = Supervisor(spec, WatchdogConfig(ladder=("fast", "safe")))
    second = supervisor._next_spec(spec)
    third = supervisor._next_spec(second)  # the last rung repeats
    cpus = os.cpu_count() or 1
    assert second.profile == third.profile == "safe"
    assert second.loader.workers == third.loader.workers == min(2, cpus)  # half of 4, both times
    assert "prefetch_factor" not in second.user_keys and second.loader.prefetch_factor == 2  # safe's own
    second.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    resumed = launch.make_spec(resume=str(Path(spec.run_dir) / "weights" / "last.pt"))  # no usage error
    assert resumed.profile == "safe" and resumed.loader.workers == min(2, cpus) and resumed.workers_requested == 4


def test_a_profile_off_the_ladder_steps_down_never_back_to_worker_processes():
    from rocm_yolo.profiles import next_profile

    assert next_profile("threads", ("fast", "safe", "single")) == "single"
    assert next_profile("safe", ("fast", "threads")) == "threads"
    assert next_profile("single", ("fast", "safe")) == "single"  # nothing safer on it: it stays


def test_the_python_api_checks_the_ladder_before_it_claims_a_directory(tiny_data, tmp_path):
    import rocm_yolo

    for bad in ((), ("fast", "warp"), (1, 2)):
        with pytest.raises(UsageError):
            rocm_yolo.train(data=str(tiny_data), project=str(tmp_path), fallback=bad, device="cpu")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- sample order


class Recording(torch.utils.data.Dataset):
    """Items are their own indices; ``asked`` records what the loader asked for (in this process)."""

    def __init__(self, n: int):
        self.n, self.asked = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        self.asked.append(index)
        return index


def loader(n=22, batch=4, workers=0):
    from ultralytics.data.build import build_dataloader

    return build_dataloader(Recording(n), batch=batch, workers=workers, shuffle=True, rank=-1)


def epoch(ld, count=None):
    """One epoch as Ultralytics' loop sees it: ``len(ld)`` batches (or ``count``) of the persistent iterator."""
    import itertools

    return [b.tolist() for b in itertools.islice(ld, count if count is not None else len(ld))]


def order_of(state, n, batch):
    g = torch.Generator()
    g.set_state(state)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i:i + batch] for i in range(0, n, batch)]


def test_a_pass_resumes_from_its_state_without_asking_for_the_batches_done():
    torch.manual_seed(0)
    a = loader()
    sampler = sample_order.install(a)
    assert sample_order.install(a) is sampler  # idempotent
    full = [epoch(a) for _ in range(3)]
    assert [order_of(sampler.state_of(k), 22, 4) for k in range(3)] == full  # the recorded states make the passes

    torch.manual_seed(1)  # another process: another seed, another generator
    b = loader()
    resumed = sample_order.install(b)
    called = []
    resumed.resume_next_pass(sampler.state_of(1), skip=2 * 4, on_start=lambda: called.append(True))
    rest = epoch(b, count=len(b) - 2)
    assert rest == full[1][2:] and called == [True]
    assert b.dataset.asked == [i for batch in full[1][2:] for i in batch]  # never asked for the first two batches
    assert epoch(b) == full[2]  # the next pass matches too
    assert len(b) == len(a) == 6  # batches per epoch unchanged


def test_the_tracker_finds_each_epochs_pass_despite_prefetch_and_resets():
    torch.manual_seed(0)
    ld = loader(workers=2)  # worker processes prefetch into the next pass
    sampler = sample_order.install(ld)
    tracker = sample_order.PassTracker(sampler)
    seen = []
    try:
        for e in range(4):
            if e == 2:
                ld.reset()  # as when mosaic closes: the pass drawn ahead is dropped
            tracker.epoch_started()
            batches = []
            for i, batch in enumerate(ld):
                if i == 0:
                    number = tracker.first_batch(ld.iterator)
                batches.append(batch.tolist())
            seen.append(number)
            assert order_of(sampler.state_of(number), 22, 4) == batches  # the state that made this epoch's pass
    finally:
        ld.close()
    assert seen[:2] == [0, 1] and seen[2] > 2 and seen[3] == seen[2] + 1  # the pass drawn ahead was dropped


# --------------------------------------------------------------------------- the training loop


class Toy:
    """A stand-in with the loop's shape: locals i (a cell, as in _do_train on 3.11), last_opt_step."""

    def __init__(self, callback):
        self.callback = callback

    def _do_train(self):
        last_opt_step = -1
        seen = []
        for i, item in enumerate(range(3)):
            self.callback(self)
            seen.append((i, last_opt_step, {k: i for k in "a"}["a"]))
        return seen


def test_loop_locals_can_be_set_from_a_callback():
    def callback(trainer):
        frame = trainloop.loop_frame(trainer)
        if trainloop.read_locals(frame)["i"] == 1:
            trainloop.set_local(frame, "last_opt_step", 7)

    assert Toy(callback)._do_train() == [(0, -1, 0), (1, 7, 1), (2, 7, 2)]


def test_enumerate_offset_only_for_the_armed_loader_and_removable():
    import ultralytics.engine.trainer as module

    trainloop.install()
    trainloop.install()  # idempotent
    try:
        data = ["c", "d", "e"]  # what the sampler yields for a pass resumed after 2 of 5 batches
        trainloop.arm(data, start=2, count=3)
        assert list(module.enumerate(data)) == [(2, "c"), (3, "d"), (4, "e")]
        assert list(module.enumerate(["x"])) == [(0, "x")]  # any other iterable: the builtin
        trainloop.disarm()
        assert list(module.enumerate(data)) == [(0, "c"), (1, "d"), (2, "e")]
    finally:
        trainloop.uninstall()
    assert "enumerate" not in module.__dict__ and not trainloop.installed()


def test_this_ultralytics_has_every_internal_mid_epoch_resume_needs():
    assert compat.missing_for(compat.MID_EPOCH_FEATURE) == []


# --------------------------------------------------------------------------- which checkpoint to resume


def fake_checkpoint(path: Path, age: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ckpt/data.pkl", b"x" * 100)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_the_newest_valid_checkpoint_is_chosen(tmp_path):
    paths = RunPaths(tmp_path / "run")
    last = fake_checkpoint(paths.last, age=100)
    fake_checkpoint(paths.mid_checkpoint(2, 10), age=50)
    mid = fake_checkpoint(paths.mid_checkpoint(2, 20), age=40)
    assert checkpoints.choose_resume_point(last)[0] == mid
    mid.write_bytes(mid.read_bytes()[:60])  # damaged (cannot happen with atomic writes, but a disk can fail)
    path, note = checkpoints.choose_resume_point(last)
    assert path == paths.mid_checkpoint(2, 10) and "skipped the mid-epoch checkpoint ep2-ba20.pt" in note
    fake_checkpoint(last, age=0)  # the epoch ended and was saved, but its mid-epoch files were not yet removed
    assert checkpoints.choose_resume_point(last) == (last, "skipped the mid-epoch checkpoint ep2-ba20.pt: "
                                                           "truncated or not a torch checkpoint")
    removed = checkpoints.remove_mid_checkpoints(paths, through_epoch=2)
    assert sorted(p.name for p in removed) == ["ep2-ba10.pt", "ep2-ba20.pt"] and paths.mid_checkpoints() == []


def test_a_run_with_only_mid_epoch_checkpoints_is_found_and_resumable(tmp_path):
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    mid = fake_checkpoint(paths.mid_checkpoint(1, 500))  # a hang in the first epoch: no last.pt yet
    assert checkpoints.find_latest(tmp_path / "runs") == paths.last
    assert checkpoints.choose_resume_point(paths.last)[0] == mid
    assert checkpoints.is_mid_checkpoint(mid) and not checkpoints.is_mid_checkpoint(paths.last)


# --------------------------------------------------------------------------- work lost


def beat(seq, epoch, batch, total, phase="train", pid=100, it_s=10.0, t=0.0):
    return Heartbeat(seq=seq, pid=pid, attempt=1, phase=phase, epoch=epoch, epochs=3, batch=batch, batches=24,
                     step_max=0.1, step_last=0.1, batches_total=total, it_s=it_s, time=t, started=0)


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


@pytest.fixture
def spec(tmp_path):
    r = resolve("fast", 2, cpu_count=4)
    return RunSpec(data="d.yaml", model="m.yaml", run_dir=str(tmp_path / "run"), profile="fast", loader=r.loader,
                   val=r.val, train_args={"epochs": 3})


class Scripted:
    """A fake child showing scripted heartbeats, then exiting or going silent."""

    def __init__(self, clock, beats, pid, exit_at=None):
        self.clock, self.beats, self.pid, self.exit_at = clock, sorted(beats.items()), pid, exit_at

    def poll(self):
        return 0 if self.exit_at is not None and self.clock() >= self.exit_at else None

    def heartbeats(self):
        """The scripted heartbeats due since the last call, as the pipe gives them."""
        due = [hb for t, hb in self.beats if t <= self.clock()]
        new, self.seen = due[getattr(self, "seen", 0):], len(due)
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
    sup = Supervisor(spec, config, child_factory=factory, clock=clock,
                     sleep=lambda dt: now.__setitem__(0, now[0] + dt), log=RunLog(stream=open(os.devnull, "w")))
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
    rest = [beat(k, 2, 10 + k, k, pid=101) for k in range(1, 15)] + [beat(15, 2, 3, 14, phase="val", pid=101),
                                                                     beat(16, 2, 3, 14, phase="done", pid=101)]
    at = [100.5 + k / 10 for k in range(len(rest))]  # a batch every 0.1 s: ten between two polls
    fast = Scripted(clock, {t: dataclasses.replace(hb, time=t) for t, hb in zip(at, rest)}, pid=101, exit_at=at[-1])
    children = iter([hung, fast])
    config = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=2, poll_interval=1)
    sup = Supervisor(spec, config, child_factory=lambda s, c: next(children), clock=clock,
                     sleep=lambda dt: now.__setitem__(0, now[0] + dt), log=RunLog(stream=open(os.devnull, "w")))
    [record] = sup.run().recoveries
    assert record["resumed_at"] == [2, 10] and record["retrained_batches"] == 4 and record["cause"] == "hang"
    assert record["retrain_seconds"] == 0.3  # batch 11 to 14 again, by the trainer's clock, not the polls


def test_a_position_survives_autobatch_and_imgsz_rounding_but_not_a_real_change():
    """Ultralytics stores what it used (AutoBatch's 16 for batch=-1, 608 for imgsz=600): asking again
    for what the run asked for is no change; another batch or imgsz is."""
    from rocm_yolo.midepoch import position_mismatch

    ckpt = {"train_args": {"batch": 16, "imgsz": 608},
            checkpoints.MID_EPOCH_KEY: {"batch": 3, "requested": {"batch": -1, "imgsz": 600}}}
    assert position_mismatch(ckpt, {"batch": -1, "imgsz": 600}) is None  # a restart asks for the same
    assert position_mismatch(ckpt, {"batch": 16, "imgsz": 608}) is None  # what it used
    assert position_mismatch(ckpt, {"batch": 8}) == "batch 16 -> 8"
    assert position_mismatch(ckpt, {"imgsz": 640}) == "imgsz 608 -> 640"
    old = {"train_args": {"batch": 16}, checkpoints.MID_EPOCH_KEY: {"batch": 3}}  # written before "requested"
    assert position_mismatch(old, {"batch": 16}) is None and position_mismatch(old, {"batch": 4}) == "batch 16 -> 4"
    assert position_mismatch({"train_args": {"batch": 16}}, {"batch": 4}) is None  # not a mid-epoch checkpoint
