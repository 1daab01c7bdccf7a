"""The start-up allowance is for a start-up that moves (issue 44): its processes' CPU time and I/O bytes, read as the
heartbeat is; one stopped from outside, or still for the stall timeout, is a hang then. Scripted readings,
fake clock."""

from __future__ import annotations

import fakes
from fakes import Clock, ScriptedChild, beat
from rocm_yolo import errors
from rocm_yolo.process.kernel_view import ProcessMove
from rocm_yolo.run.supervisor_state import read_state
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.stall import MOVE_CPU, StallDetector

CONFIG = WatchdogConfig(stall_timeout=60, step_multiplier=10, startup_grace=900, max_restarts=1, poll_interval=1)


def moving(until: float, state: str = "S", cpu_per_s: float = 1.0, stop_at: float | None = None) -> dict:
    """Readings of one trainer (pid 100) each second up to ``until``: using ``cpu_per_s`` of CPU until ``stop_at``
    (then still, in ``state``)."""
    out = {}
    for t in range(0, int(until) + 1):
        moved = t if stop_at is None else min(t, stop_at)
        now_state = state if stop_at is not None and t >= stop_at else "S"
        out[float(t)] = {100: ProcessMove(start=1, state=now_state, cpu=moved * cpu_per_s, io=0)}
    return out


def test_a_start_up_that_moves_keeps_its_allowance():
    det = StallDetector(CONFIG, now=0.0)
    for t in range(0, 400, 2):
        det.observe_movement({100: ProcessMove(1, "R", t * 0.5, 0)}, float(t))  # 1 s of CPU every 2 s
        assert not det.stalled(float(t))  # 400 s of silence, but moving: the 900 s grace holds
    assert det.timeout() == 900


def test_a_start_up_that_does_not_move_is_a_hang_after_the_stall_timeout():
    det = StallDetector(CONFIG, now=0.0)
    det.observe_movement({100: ProcessMove(1, "D", 3.0, 10)}, 0.0)
    for t in (10.0, 30.0, 60.0):
        det.observe_movement({100: ProcessMove(1, "D", 3.0 + MOVE_CPU / 10, 10)}, t)  # a tick of noise
        assert not det.stalled(t)
    det.observe_movement({100: ProcessMove(1, "D", 3.0 + MOVE_CPU / 10, 10)}, 61.0)
    assert det.stalled(61.0) and "have not moved (CPU time, I/O) for 61 s" in det.why_still(61.0)


def test_io_and_a_new_process_are_movement_and_a_reused_pid_is_another_process():
    det = StallDetector(CONFIG, now=0.0)
    det.observe_movement({100: ProcessMove(1, "S", 1.0, 0)}, 0.0)
    assert not det.observe_movement({100: ProcessMove(1, "S", 1.2, 1 << 10)}, 10.0)  # a tick and a KiB: noise
    assert det.observe_movement({100: ProcessMove(1, "S", 1.0, 2 << 20)}, 50.0)  # 2 MiB read: a scan, a cache
    assert det.observe_movement({100: ProcessMove(1, "S", 1.0, 2 << 20), 101: ProcessMove(5, "S", 0, 0)}, 100.0)
    assert det.observe_movement({100: ProcessMove(1, "S", 1.0, 2 << 20), 101: ProcessMove(9, "S", 0, 0)}, 150.0)
    assert not det.stalled(200.0)


def test_stopped_from_outside_is_said_and_no_reading_is_no_verdict():
    det = StallDetector(CONFIG, now=0.0)
    det.observe_movement({100: ProcessMove(1, "T", 2.0, 0)}, 1.0)
    assert det.stopped == {100: "T"} and "pid 100 is stopped (not by rocm-yolo's Ctrl-Z)" in det.why_still(2.0)
    blind = StallDetector(CONFIG, now=0.0)
    for t in range(0, 300, 10):
        blind.observe_movement(None, float(t))  # no /proc: the grace, as before
    assert not blind.stalled(299.0)


def test_a_pause_is_no_time_without_movement_and_the_first_batch_ends_the_rule():
    det = StallDetector(CONFIG, now=0.0)
    det.observe_movement({100: ProcessMove(1, "S", 0.0, 0)}, 0.0)
    det.pause(500.0)  # Ctrl-Z: the supervisor stopped the tree and itself
    assert not det.stalled(100.0)
    det.observe(beat(1, batch=1, batches_total=1), 520.0)  # training: the stall timeout, by heartbeats
    assert not det.still(600.0) and not det.stalled(579.0) and det.stalled(581.0)


def test_a_stopped_start_up_is_a_hang_in_the_stall_timeout_plus_30_s_and_status_hears_of_it(spec):
    """SIGSTOP from outside while the trainer imports torch: no heartbeat yet, no movement; found after the stall
    timeout (60 s here), not the 900 s grace; supervisor.json says it was stopped while it was."""
    clock = Clock()
    seen = []
    stopped = ScriptedChild(clock, {}, moves=moving(200, state="T", stop_at=3))
    then = ScriptedChild(clock, {5: beat(1, batch=1, batches_total=1)}, exit_at=10, pid=101, moves=moving(10))
    sup = fakes.supervisor(spec, [stopped, then], clock, CONFIG)
    write = sup._write_state
    sup._write_state = lambda *a, **k: (write(*a, **k), seen.append(read_state(spec.paths).still))
    result = sup.run()
    assert result.exit_code == errors.OK and len(result.hangs) == 1
    assert result.hangs[0].stalled_seconds <= CONFIG.stall_timeout + 30
    told = [s for s in seen if s is not None]
    assert told and told[0].stopped and told[0].pids == [100]
    assert seen[-1] is None  # the attempt is over: no stop to tell of


def test_a_start_up_that_moves_slowly_is_no_hang(spec):
    clock = Clock()
    slow = ScriptedChild(clock, {600: beat(1, batch=1, batches_total=1)}, exit_at=610, moves=moving(610, cpu_per_s=1))
    result, _ = fakes.supervise(spec, [slow], clock, CONFIG)
    assert result.exit_code == errors.OK and result.hangs == []  # 600 s of start-up, moving: the grace


def test_a_still_start_up_is_told_for_status_and_ends_as_a_hang(spec):
    clock = Clock()
    still = ScriptedChild(clock, {}, moves=moving(300, state="D", stop_at=2))
    then = ScriptedChild(clock, {5: beat(1, batch=1, batches_total=1)}, exit_at=10, pid=101, moves=moving(10))
    seen = []
    sup = fakes.supervisor(spec, [still, then], clock, CONFIG)
    write = sup._write_state
    sup._write_state = lambda *a, **k: (write(*a, **k), seen.append(read_state(spec.paths).still))
    result = sup.run()
    assert result.exit_code == errors.OK and len(result.hangs) == 1 and result.hangs[0].stalled_seconds <= 90
    told = next(s for s in seen if s is not None)
    assert not told.stopped and told.since > 0


def test_the_supervisors_own_ctrl_z_during_a_start_up_is_no_time_without_movement(spec):
    """Ctrl-Z stops the tree with the supervisor (job control): the time stopped is no hang, nor is the tree's stop
    then a stop from outside; a start-up that moves again after it keeps its allowance."""
    clock = Clock()
    moves = moving(50, stop_at=40)  # moving until 40 s, then still; the Ctrl-Z at 50 s stops it for 1000 s
    # after the continue, still for 45 s more (55 s in all without the 1000 s stopped), then moving again
    moves.update({float(t): {100: ProcessMove(1, "S", 40.0 + max(t - 1095, 0), 0)} for t in range(1050, 1200)})
    child = ScriptedChild(clock, {1150: beat(1, batch=1, batches_total=1)}, exit_at=1160, moves=moves)
    result = fakes.suspended(spec, child, clock, CONFIG, at=50, seconds=1000).run()
    assert result.exit_code == errors.OK and result.hangs == []
