"""``rocm-yolo status``: what it reads, and what it makes of a run's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from rocm_yolo import status
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state


def test_status_survives_badly_typed_state_files(tmp_path):
    paths = RunPaths(tmp_path / "run")
    paths.state.mkdir(parents=True)
    paths.heartbeat.write_text(json.dumps({"seq": "x", "pid": [], "phase": 3}))
    paths.supervisor.write_text(json.dumps({"state": 7, "restarts": "two", "hangs": "many"}))
    for args in ([], ["--json"]):
        r = subprocess.run(
            [sys.executable, "-m", "rocm_yolo", "status", str(paths.run_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert read_state(paths.run_dir) is None


NOW = 1_700_000_000.0


def write_run(
    tmp_path, *, state="running", supervisor_pid=None, age=5.0, phase="train", step=0.5, watchdog=None, node=None
):
    """A run directory as a supervisor and its trainer leave it (a node's share of it): supervisor.json and
    heartbeat.json."""
    paths = RunPaths(tmp_path / "run", node)
    record = {
        "state": state,
        "supervisor_pid": supervisor_pid or os.getpid(),
        "child_pid": None,
        "attempt": 2,
        "profile": "safe",
        "restarts": 1,
        "max_restarts": 3,
        "hangs": [
            {"epoch": 2, "batch": 14, "phase": "train", "stalled_seconds": 30.0, "stacks": None, "detected": NOW - 100}
        ],
        "lost_seconds": 42.4,
        "recoveries": [
            {
                "attempt": 2,
                "cause": "hang",
                "lost_at": [2, 14],
                "resumed_at": [2, 10],
                "batches": 16,
                "checkpoint": "ep2-ba10.pt",
                "retrained_batches": 4,
                "detect_seconds": 30.0,
                "restart_seconds": 12.0,
                "retrain_seconds": 0.4,
            }
        ],
        "started": NOW - 600,
        "updated": NOW - age,
    }
    if watchdog is not None:
        record["watchdog"] = watchdog
    paths.node_dir.mkdir(parents=True, exist_ok=True)
    paths.supervisor.write_text(json.dumps(record))  # as a supervisor wrote it
    beat = {
        "seq": 9,
        "pid": 77,
        "attempt": 2,
        "phase": phase,
        "epoch": 2,
        "epochs": 3,
        "batch": 12,
        "batches": 16,
        "step_max": step,
        "step_last": step,
        "batches_total": 3,
        "it_s": 2.0,
        "time": NOW - age,
        "started": NOW - 60,
    }
    paths.heartbeat.write_text(json.dumps(beat))
    return paths


def test_a_running_run_shows_progress_speed_eta_and_its_restarts(tmp_path):
    paths = write_run(tmp_path)
    info = status.collect(paths.run_dir, now=NOW)
    assert info["state"] == "running" and (info["epoch"], info["batch"], info["batches"]) == (2, 12, 16)
    assert info["eta_seconds"] == (4 + 16) / 2.0 and info["heartbeat_age"] == 5.0
    text = status.render(info)
    assert "progress:  epoch 2/3, train batch 12/16" in text and "ETA 0:00:10" in text
    assert "state:     running (restarted 1 times)" in text and "hangs:     1, 42 s lost" in text
    assert (
        "restart:   attempt 2: hang at epoch 2, batch 14, resumed at epoch 2, batch 10 from ep2-ba10.pt, "
        "4 batches trained again (30 s to detect, 12 s to restart, 0 s retraining)"
    ) in text


def test_a_finished_run_says_done_without_the_final_validations_batch_and_speed(tmp_path):
    paths = write_run(tmp_path, state="finished", phase="done")
    text = status.render(status.collect(paths.run_dir, now=NOW))
    assert "state:     finished" in text and "progress:  done after epoch 2/3" in text
    assert "batch" not in text.split("progress:")[1].splitlines()[0] and "it/s" not in text and "ETA" not in text


def test_a_supervisor_that_is_gone_is_stopped_not_running(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    paths = write_run(tmp_path, supervisor_pid=dead.pid)
    assert status.collect(paths.run_dir, now=NOW)["state"] == "stopped"


def test_stalled_is_what_the_runs_own_watchdog_would_say(tmp_path):
    """The run's stall timeout (as its supervisor recorded it), grown by slow steps, not a second guess."""
    watchdog = {"enabled": True, "stall_timeout": 30.0, "step_multiplier": 10.0, "startup_grace": 900.0}
    assert status.collect(write_run(tmp_path, age=29, watchdog=watchdog).run_dir, now=NOW)["state"] == "running"
    assert status.collect(write_run(tmp_path, age=31, watchdog=watchdog).run_dir, now=NOW)["state"] == "stalled?"
    slow = write_run(tmp_path, age=31, step=20.0, watchdog=watchdog)  # steps of 20 s: 200 s before it is a hang
    assert status.collect(slow.run_dir, now=NOW)["state"] == "running"
    default = write_run(tmp_path, age=170)  # no record of the settings: the defaults (180 s)
    assert status.collect(default.run_dir, now=NOW)["state"] == "running"
    done = write_run(tmp_path, age=10_000, phase="done", watchdog=watchdog)
    assert status.collect(done.run_dir, now=NOW)["state"] == "running"  # the trainer said it is done


def test_status_of_a_folder_that_is_no_run_is_a_usage_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "status", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "is not a rocm-yolo run directory" in r.stderr and "Traceback" not in r.stderr


def test_each_rank_of_a_multi_gpu_run_is_shown_where_it_was_last_heard(tmp_path):
    paths = write_run(tmp_path)
    beat = json.loads(paths.heartbeat.read_text())
    paths.heartbeat_of(1).write_text(json.dumps(dict(beat, rank=1, pid=78, batch=11, time=NOW - 40)))
    text = status.render(status.collect(paths.run_dir, now=NOW))
    assert "progress:  epoch 2/3, train batch 12/16" in text  # rank 0 speaks for the run
    assert "rank 1:    epoch 2, train batch 11/16, 40 s ago (attempt 2)" in text
    paths.heartbeat.write_text(json.dumps(dict(beat, phase="done")))
    assert "rank 1" not in status.render(status.collect(paths.run_dir, now=NOW))  # finished: rank 0 says it


def test_a_stopped_run_has_no_speed_and_the_profile_is_its_attempts_own(tmp_path):
    """An interrupted, failed or broken run shows where it stopped, not a speed or an ETA; the heartbeat's attempt
    is named with the profile that attempt ran on (its spec), not the newest attempt's."""
    for state in ("interrupted", "failed", "internal_error"):
        paths = write_run(tmp_path, state=state)
        text = status.render(status.collect(paths.run_dir, now=NOW))
        assert "progress:  epoch 2/3, train batch 12/16" in text and "it/s" not in text and "ETA" not in text
    from rocm_yolo.policy.profiles import resolve
    from rocm_yolo.run.spec import RunSpec

    spec = RunSpec("d.yaml", "m.yaml", str(paths.run_dir), "fast", resolve("fast", 2).loader, True, {}, attempt=2)
    spec.save()  # attempt 2 (the heartbeat's) ran on fast; supervisor.json's newest profile is safe
    assert "(attempt 2, profile fast)" in status.render(status.collect(paths.run_dir, now=NOW))


def test_a_run_whose_final_validation_was_stopped_is_done_and_says_so(tmp_path):
    paths = write_run(tmp_path, state="finished", phase="val")
    record = json.loads(paths.supervisor.read_text())
    paths.supervisor.write_text(json.dumps(dict(record, detail="the final validation was interrupted")))
    text = status.render(status.collect(paths.run_dir, now=NOW))
    assert "state:     finished (restarted 1 times; the final validation was interrupted)" in text
    assert "progress:  done after epoch 2/3" in text and "val batch" not in text


def test_ranks_of_an_earlier_attempt_are_not_this_attempts(tmp_path):
    """A run resumed from two GPUs onto one keeps the old heartbeat-rank1.json: not a rank of this attempt."""
    paths = write_run(tmp_path)
    beat = json.loads(paths.heartbeat.read_text())
    paths.heartbeat_of(1).write_text(json.dumps(dict(beat, rank=1, pid=78, attempt=1, time=NOW - 922)))
    assert "rank 1" not in status.render(status.collect(paths.run_dir, now=NOW))


def test_a_multi_node_run_shows_every_node_and_its_ranks(tmp_path):
    from rocm_yolo.run.nodes import join_round

    node0 = write_run(tmp_path, node=0)
    node1 = write_run(tmp_path, node=1, age=40, state="finished")
    beat = json.loads(node0.heartbeat.read_text())
    node0.heartbeat_of(1).write_text(json.dumps(dict(beat, rank=1, local_rank=1, batch=11, time=NOW - 7)))
    node1.heartbeat.write_text(json.dumps(dict(beat, rank=2, local_rank=0, batch=10, time=NOW - 40)))
    node1.heartbeat_of(3).write_text(json.dumps(dict(beat, rank=3, local_rank=1, batch=9, time=NOW - 41)))
    join_round(node0, "safe")
    info = status.collect(node0.run_dir, now=NOW)
    assert [n["node"] for n in info["nodes"]] == [0, 1] and info["round"]["number"] == 1
    text = status.render(info)
    assert "nodes:     2 (round 1)" in text
    assert "node 0:    running (restarted 1 times)\n  progress:  epoch 2/3, train batch 12/16" in text
    assert "  rank 1:    epoch 2, train batch 11/16, 7 s ago (attempt 2)" in text
    assert "node 1:    finished" in text and "rank 3" not in text  # a finished node's ranks say nothing more
    r = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "status", str(node0.run_dir)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "node 1:" in r.stdout, r.stderr
    later = write_run(tmp_path, age=1).supervisor.stat().st_mtime + 10
    os.utime(RunPaths(node0.run_dir, None).supervisor, (later, later))  # later trained on by one machine alone
    assert "nodes" not in status.collect(node0.run_dir, now=NOW)


# --------------------------------------------------------------------------- what a resume starts from


def checkpoint(path, epoch: int, *, mid: bool = False, age: float = 0.0):
    """A checkpoint dict as Ultralytics (or rocm-yolo, mid-epoch) writes one, without tensors."""
    import pickle

    from helpers import fake_checkpoint

    ckpt = {"epoch": epoch, "train_args": {"epochs": 3, "task": "detect"}}
    if mid:
        ckpt["rocm_yolo_mid_epoch"] = {"epoch": epoch + 1, "batch": 10}
    return fake_checkpoint(path, payload=pickle.dumps(ckpt), age=age)


def files(root) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_a_stopped_run_shows_where_it_was_heard_and_what_a_resume_starts_from(tmp_path):
    """Heard last at epoch 2, batch 12; last.pt holds epoch 1 only: a resume trains epoch 2 from its start."""
    paths = write_run(tmp_path, state="interrupted")
    checkpoint(paths.last, 0)  # 0-based: epoch 1 done
    info = status.collect(paths.run_dir, now=NOW)
    assert info["resume"] == {"checkpoint": str(paths.last), "note": None, "epoch": 2, "batch": 0, "epochs": 3}
    text = status.render(info)
    assert "progress:  epoch 2/3, train batch 12/16" in text
    assert "resume:    from the start of epoch 2/3 (weights/last.pt)" in text
    checkpoint(paths.mid_checkpoint(2, 10), 0, mid=True)  # newer than last.pt: the newest valid checkpoint
    os.utime(paths.last, (NOW - 100, NOW - 100))
    assert "resume:    from epoch 2/3, batch 10 (weights/ep2-ba10.pt)" in status.render(status.collect(paths.run_dir))


def test_the_resume_is_what_resume_would_take_and_status_changes_nothing(tmp_path):
    """A damaged last.pt: a resume takes the verified copy (and would move the damaged file aside: status does not);
    a damaged mid-epoch checkpoint is skipped."""
    paths = write_run(tmp_path, state="failed")
    checkpoint(paths.last_good, 0)
    paths.last.write_bytes(paths.last_good.read_bytes()[:100])  # cut short by a kill in its save
    paths.mid_checkpoint(2, 14).write_bytes(b"PK\x03\x04 cut short")
    before = files(tmp_path)
    info = status.collect(paths.run_dir, now=NOW)
    assert info["resume"]["checkpoint"] == str(paths.last_good) and "verified copy" in info["resume"]["note"]
    assert "resume:    from the start of epoch 2/3 (weights/last_good.pt)" in status.render(info)
    assert files(tmp_path) == before


def test_a_stopped_run_with_nothing_to_resume_says_why_and_a_live_or_finished_run_says_nothing(tmp_path):
    paths = write_run(tmp_path, state="interrupted")
    text = status.render(status.collect(paths.run_dir, now=NOW))
    assert f"resume:    none (checkpoint not found: {paths.last})" in text
    checkpoint(paths.last, 0)
    for state, phase in (("running", "train"), ("finished", "done")):
        paths = write_run(tmp_path, state=state, phase=phase)
        info = status.collect(paths.run_dir, now=NOW)
        assert "resume" not in info and "resume:" not in status.render(info)
    paths = write_run(tmp_path, state="running", supervisor_pid=2**22 + 1)  # its supervisor is gone: stopped
    assert "resume:    from the start of epoch 2/3" in status.render(status.collect(paths.run_dir, now=NOW))


def test_a_multi_node_run_shows_the_runs_resume_once(tmp_path):
    node0 = write_run(tmp_path, node=0, state="interrupted")
    write_run(tmp_path, node=1, state="interrupted")
    checkpoint(RunPaths(node0.run_dir).last, 1)
    text = status.render(status.collect(node0.run_dir, now=NOW))
    assert "node 1:" in text and text.count("resume:") == 1 and "resume:    from the start of epoch 3/3" in text


def stop(pid: int) -> None:
    """SIGSTOP ``pid``, and wait until the kernel shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_trainer_stopped_from_outside_or_a_start_up_that_does_not_move_is_said_with_how_long(tmp_path):
    """Issue 44: 'running, heartbeat 562 s ago' with no word of a stopped process is what status said before."""
    paths = write_run(tmp_path, age=40)
    record = json.loads(paths.supervisor.read_text())
    record["still"] = {"since": NOW - 35, "stopped": False, "pids": None}
    paths.supervisor.write_text(json.dumps(record))
    text = status.render(status.collect(paths.run_dir, now=NOW))
    assert "trainer:   its start-up has not moved (CPU time, I/O) for 35 s" in text
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stop(trainer.pid)
        record.update(child_pid=trainer.pid, still={"since": NOW - 12, "stopped": True, "pids": [trainer.pid]})
        paths.supervisor.write_text(json.dumps(record))
        info = status.collect(paths.run_dir, now=NOW)
        assert info["stopped"] and info["still_seconds"] == 12
        assert (
            "trainer:   stopped (state T: a SIGSTOP or a debugger, not rocm-yolo's Ctrl-Z) for 12 s"
            in status.render(info)
        )
    finally:
        trainer.kill()
        trainer.wait()
    # Ctrl-Z: the supervisor stopped its tree and itself (job control): a stopped supervisor and its stopped child
    job = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    supervisor = subprocess.Popen([sys.executable, "-c", f"{job}; print(c.pid, flush=True); time.sleep(60)"],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
    child = int(supervisor.stdout.readline())
    try:
        stop(child)
        stop(supervisor.pid)
        record.update(supervisor_pid=supervisor.pid, child_pid=child, still=None)
        paths.supervisor.write_text(json.dumps(record))
        said = status.render(status.collect(paths.run_dir, now=NOW))
        assert "stopped with its supervisor (Ctrl-Z)" in said and "not rocm-yolo's" not in said
    finally:
        os.kill(child, signal.SIGKILL)
        supervisor.kill()
        supervisor.wait()
    record.update(supervisor_pid=os.getpid(), still=None)
    paths.supervisor.write_text(json.dumps(record))
    assert "trainer:" not in status.render(status.collect(paths.run_dir, now=NOW))  # gone, or moving: nothing to say
