"""The supervisor loop and the stall detector, driven by scripted heartbeats and a fake clock."""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import replace
from pathlib import Path

import fakes
from fakes import Clock, ScriptedChild, beat
from rocm_yolo import errors
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.nodes import say_alive
from rocm_yolo.supervisor import stall
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.loop import Supervisor
from rocm_yolo.supervisor.stall import StallDetector

CONFIG = WatchdogConfig(stall_timeout=60, step_multiplier=10, startup_grace=300, max_restarts=2, poll_interval=1)


def steady(clock, seconds, step, start=5.0, phase="train"):
    """A run that makes one step every ``step`` seconds for ``seconds``, then finishes."""
    events, t, seq = {}, start, 1
    while t < seconds:
        events[t] = beat(seq, phase=phase, batch=seq, batches_total=seq, step=step)
        t += step
        seq += 1
    return ScriptedChild(clock, events, exit_at=seconds)


def supervise(spec, children, clock, config=CONFIG, **kw):
    return fakes.supervise(spec, children, clock, config, **kw)


def test_slow_but_steady_steps_are_no_hang(spec):
    clock = Clock()
    # 90 s per step: longer than the 60 s floor, but steady: the timeout grows to 10 x 90 s.
    result, made = supervise(spec, [steady(clock, 2000, 90)], clock)
    assert result.exit_code == errors.OK and result.hangs == [] and len(made) == 1


def test_long_validation_and_save_are_no_hang(spec):
    clock = Clock()
    events = {5: beat(1), 6: beat(2, batch=2, batches_total=2, step=1)}
    # validation: 40 batches of 20 s each (ticks keep coming), then a save that takes 50 s
    t, seq = 10, 3
    for i in range(40):
        events[t] = beat(seq, phase="val", batch=i + 1, step=20)
        t, seq = t + 20, seq + 1
    events[t + 50] = beat(seq, phase="save", step=20)
    child = ScriptedChild(clock, events, exit_at=t + 60)
    result, _ = supervise(spec, [child], clock)
    assert result.exit_code == errors.OK and result.hangs == []


def test_startup_grace_before_the_first_batch(spec):
    clock = Clock()
    child = ScriptedChild(clock, {250: beat(1, batch=1, batches_total=1)}, exit_at=260)  # 250 s scan: > floor, < grace
    result, _ = supervise(spec, [child], clock)
    assert result.exit_code == errors.OK and result.hangs == []


def test_a_loader_that_never_gives_the_first_batch_is_a_hang_after_the_stall_timeout_not_the_grace(spec):
    """The seeds' "0/N": start-up is done, the loader is iterated for its first batch, and nothing comes."""
    clock = Clock()
    waits = ScriptedChild(
        clock,
        {5: beat(1, startup="data", batch=0, batches_total=0, phase="setup", epoch=0),
         10: beat(2, startup="first-batch", batch=0, batches_total=0)},
    )  # fmt: skip
    tuned = ScriptedChild(  # the first batch came: its step may tune GPU kernels for minutes (the grace)
        clock, {5: beat(1, startup="first-step", batch=0, batches_total=0), 250: beat(2)}, exit_at=255
    )
    result, made = supervise(spec, [waits, tuned], clock)
    assert result.exit_code == errors.OK and len(made) == 2
    [hang] = result.hangs
    assert hang.stalled_seconds <= CONFIG.stall_timeout + 2  # 60 s, not the 300 s grace


def test_a_restarts_start_up_allowance_comes_from_the_runs_own_first_start_up(spec):
    clock = Clock()
    first = ScriptedChild(clock, {20: beat(1)}, exit_at=30, code=1)  # trained its first batch 20 s after it started
    silent = ScriptedChild(clock, {2: beat(1, phase="setup", epoch=0, batch=0, batches_total=0)})  # then nothing
    result, made = supervise(spec, [first, silent, steady(clock, 60, 1)], clock)
    assert result.exit_code == errors.OK and len(made) == 3
    [hang] = result.hangs
    assert hang.stalled_seconds <= 61  # 3 x 20 s = 60 s (at least the 60 s floor), not the 300 s grace
    assert stall.Startup().allowance(CONFIG) is None  # nothing measured yet: the grace


def test_a_hang_is_detected_dumped_killed_and_resumed_on_the_next_profile(spec):
    clock = Clock()
    weights = Path(spec.run_dir) / "weights"
    weights.mkdir(parents=True)
    with zipfile.ZipFile(weights / "last.pt", "w") as z:
        z.writestr("last/data.pkl", pickle.dumps({"epoch": 0, "train_args": {"epochs": 3}}))
    hung = ScriptedChild(clock, {5: beat(1), 6: beat(2, batch=2, batches_total=2)})  # stops at t=6
    healthy = steady(clock, 200, 1, start=clock.now)
    healthy.events = [(t + 70, hb) for t, hb in healthy.events]
    healthy.exit_at = 300
    result, made = supervise(spec, [hung, healthy], clock)
    assert result.exit_code == errors.OK and result.restarts == 1
    assert hung.dumped and hung.killed and healthy.killed  # the tree goes on every path
    [hang] = result.hangs
    assert hang.epoch == 1 and hang.batch == 2 and Path(hang.stacks).name == "hang-1-stacks.txt"
    assert 60 < hang.stalled_seconds <= 62  # the 60 s floor (steps were 1 s), within one tick
    assert [s.profile for s in made] == ["fast", "safe"]
    assert made[1].resume == str(weights / "last.pt") and made[1].attempt == 2
    assert made[1].loader.persistent_workers is False and made[1].val is False


def test_crashes_are_restarted_down_the_ladder_then_given_up(spec):
    clock = Clock()
    children = [ScriptedChild(clock, {}, exit_at=1, code=1) for _ in range(4)]
    result, made = supervise(spec, children, clock, config=replace(CONFIG, max_restarts=3))
    assert result.exit_code == errors.FAILED and result.restarts == 3
    assert [s.profile for s in made] == ["fast", "safe", "threads", "single"]  # the default ladder
    assert made[1].resume is None  # no checkpoint yet: start again in the same directory
    threads, single = made[2].loader, made[3].loader
    assert threads.workers == 0 and threads.threads == min(8, os.cpu_count()) and threads.prefetch_factor == 2
    assert made[2].val is True and made[2].env == {}  # safe's val=False and OMP_NUM_THREADS do not follow
    assert single.workers == 0 and single.threads == 0 and single.prefetch_factor is None  # strictly one thread
    assert made[3].train_args["exist_ok"] is True


def test_user_errors_are_not_retried(spec):
    clock = Clock()
    result, made = supervise(spec, [ScriptedChild(clock, {}, exit_at=1, code=errors.USAGE)], clock)
    assert result.exit_code == errors.USAGE and len(made) == 1


def test_no_watchdog_means_no_stall_detection_and_no_restart(spec):
    clock = Clock()
    config = WatchdogConfig(enabled=False, stall_timeout=1, startup_grace=1, poll_interval=1)
    child = ScriptedChild(clock, {1: beat(1)}, exit_at=5000)  # silent for over an hour, then done
    result, _ = supervise(spec, [child], clock, config=config)
    assert result.exit_code == errors.OK and result.hangs == []


def test_interrupt_stops_the_child_and_reports_130(spec):
    clock = Clock()
    child = ScriptedChild(clock, {1: beat(1)})
    sup = Supervisor(
        spec,
        CONFIG,
        child_factory=lambda s, c: child,
        clock=clock,
        sleep=lambda dt: (clock.sleep(dt), setattr(sup.signals, "interrupted", 2)),
        log=RunLog(stream=open("/dev/null", "w")),
    )
    result = sup.run()
    assert result.exit_code == errors.INTERRUPTED and child.killed


def test_detector_timeout_adapts_to_the_slowest_recent_step():
    det = StallDetector(CONFIG, now=0)
    assert det.timeout() == 300  # startup grace before the first batch
    det.observe(beat(1, step=2), now=1)
    assert det.timeout() == 60  # the floor
    det.observe(beat(2, batch=2, batches_total=2, step=30), now=31)
    assert det.timeout() == 300  # 10 x the slowest recent step
    assert not det.stalled(now=300) and det.stalled(now=332)
    assert not det.observe(beat(2, batch=2, batches_total=2, step=30), now=40)  # same seq: no progress


QUICK = replace(CONFIG, stall_timeout=20)  # a floor below the graces, as in the end-to-end tests


def ddp_steps(until: float) -> dict:
    """Two ranks' beats, one step a second from 5 s to ``until``."""
    return {t: beat(t, batch=t, batches_total=t, rank=r) for t in range(5, int(until)) for r in (0, 1)}


def test_a_rank_that_ended_gives_the_others_time_to_stop_and_the_attempt_is_a_crash_not_a_hang(spec):
    """Rank 1 killed at 20 s: rank 0 says it ends (143: torch's agent stopped it), and its tree takes 55 s to go,
    longer than the 20 s floor from the last beat: a crash, as the exit code says, not a hang."""
    clock = Clock()
    crashed = ScriptedChild(clock, ddp_steps(20), exit_at=75, code=1, exit_lines={21: (0, 143)}, rank_count=2)
    result, _ = supervise(spec, [crashed, steady(clock, 200, 1, start=80)], clock, config=QUICK)
    assert result.exit_code == errors.OK and result.hangs == [] and result.restarts == 1
    assert [f.kind for f in result.failures] == ["crash"]


def test_ranks_that_ended_and_a_tree_that_never_goes_are_a_hang_after_the_stop_grace(spec):
    clock = Clock()
    stuck = ScriptedChild(clock, ddp_steps(20), exit_lines={21: (1, 1)}, rank_count=2)
    result, _ = supervise(spec, [stuck, steady(clock, 300, 1, start=100)], clock, config=QUICK)
    [hang] = result.hangs
    assert stall.STOP_GRACE < hang.stalled_seconds <= stall.STOP_GRACE + 2  # from the exit line, not the last beat


def test_every_rank_finished_and_an_agent_that_lingers_is_stopped_as_a_finished_run(spec):
    """The ranks of this node finished; torch's agent waits for other nodes at its exit barrier, silent: no hang,
    and after the finish grace the supervisor stops it and the run is done."""
    clock = Clock()
    done = ScriptedChild(clock, ddp_steps(20), exit_lines={20: (0, 0), 22: (1, 0)}, rank_count=2)
    result, made = supervise(spec, [done], clock, config=QUICK)
    assert result.exit_code == errors.OK and result.hangs == [] and len(made) == 1 and done.killed
    assert 22 + stall.FINISH_GRACE <= clock() <= 22 + stall.FINISH_GRACE + 2


def test_one_rank_finished_and_the_other_silent_is_still_a_hang_after_the_stop_grace(spec):
    clock = Clock()
    half = ScriptedChild(clock, ddp_steps(20), exit_lines={20: (0, 0)}, rank_count=2)
    result, _ = supervise(spec, [half, steady(clock, 300, 1, start=100)], clock, config=QUICK)
    [hang] = result.hangs
    assert stall.STOP_GRACE < hang.stalled_seconds <= stall.STOP_GRACE + 2


def test_state_file_follows_the_running_attempt_and_profiles_do_not_leak_env(spec):
    from rocm_yolo.run.supervisor_state import read_state

    clock = Clock()
    seen = {}

    class Watched(ScriptedChild):
        def poll(self):
            if self.clock() >= 120 and "state" not in seen:
                seen["state"] = read_state(spec.run_dir)
            return super().poll()

    hung = ScriptedChild(clock, {5: beat(1), 6: beat(2, batch=2, batches_total=2)})
    healthy = Watched(
        clock, {100: beat(1, pid=101), 101: beat(2, batch=2, batches_total=2, pid=101)}, pid=101, exit_at=150
    )
    result, made = supervise(spec.with_changes(profile="safe", env={"OMP_NUM_THREADS": "2"}), [hung, healthy], clock)
    assert result.exit_code == errors.OK
    assert made[1].profile == "threads" and made[1].env == {}  # safe's OMP_NUM_THREADS does not follow
    state = seen["state"]
    assert (state.attempt, state.profile, state.child_pid, state.restarts) == (2, "threads", 101, 1)
    assert Path(result.hangs[0].stacks).name == "hang-1-stacks.txt"


def test_ctrl_z_stops_the_tree_with_the_supervisor_and_the_time_stopped_is_no_hang(spec):
    """SIGTSTP: the child's tree is paused, the supervisor stops itself; continued after 1000 s (longer than any
    stall timeout), the tree goes on and no hang is counted."""
    clock = Clock()
    child = steady(clock, 200, 1)
    stopped = []
    sup = fakes.suspended(spec, child, clock, CONFIG, at=50, seconds=1000)
    stop_self = sup.signals.stop_self
    sup.signals.stop_self = lambda: (stopped.append(child.paused), stop_self())
    result = sup.run()
    assert stopped == [True] and child.paused is False  # paused while the supervisor was stopped, then continued
    assert result.exit_code == errors.OK and result.hangs == []


def test_on_several_machines_restarts_join_the_round_every_node_agrees_on_and_a_missing_node_ends_the_run(spec):
    """A crash moves each node to the next round, on that round's profile (the first node to restart opened it);
    a node that did not come to the rendezvous ends the run with exit 1 and no restart."""
    from rocm_yolo.run.nodes import Nodes, join_round, mark_round_started, read_round

    nodes = Nodes(count=2, node=1, endpoint="127.0.0.1:29400", round=1)
    spec = replace(spec, nodes=nodes, train_args={"epochs": 3, "device": "0,1"})
    join_round(spec.paths, "fast")
    mark_round_started(spec.paths, 1)
    join_round(spec.paths.for_node(0), "safe", after=1)  # node 0 restarted first, and opened round 2
    clock = AliveNode(spec.paths.for_node(0))  # node 0's supervisor lives: this node's crash is its own
    children = [
        ScriptedChild(clock, {}, exit_at=1, code=1),  # round 1: the other node's rank died, ours crashed
        ScriptedChild(clock, {}, exit_at=1, code=errors.NODES_MISSING),  # round 2: node 0 did not come back
    ]
    result, made = supervise(spec, children, clock, config=replace(CONFIG, max_restarts=3))
    assert [(s.nodes.round, s.profile) for s in made] == [(1, "fast"), (2, "safe")]
    assert made[1].paths.node_dir.name == "node-1" and read_round(spec.paths).number == 2
    assert result.exit_code == errors.FAILED and result.restarts == 1 and result.detail and result.node == 1
    assert result.paths.log == spec.paths.node_dir / "rocm-yolo.log"


class AliveNode(Clock):
    """The fake clock, and another node whose supervisor lives: its count in alive.json goes up as time passes."""

    def __init__(self, paths):
        super().__init__()
        self.paths = paths
        say_alive(paths, 0)

    def sleep(self, dt: float) -> None:
        super().sleep(dt)
        say_alive(self.paths, int(self.now * 1000))


def test_on_several_machines_a_node_gone_is_met_again_without_it_and_spends_no_restart(spec):
    """Node 0's supervisor stopped answering (killed, its machine gone): node 1's crash is node 0's loss, not a fault
    of node 1's own. No restart is spent, no cause is diagnosed, and node 1 meets again in the next round, where
    (a fixed count of nodes) the rendezvous ends the run naming node 0; a crash after that is node 1's own."""
    from rocm_yolo.run.nodes import Nodes, join_round, mark_round_started

    nodes = Nodes(count=2, node=1, endpoint="127.0.0.1:29400", round=1)
    spec = replace(spec, nodes=nodes, train_args={"epochs": 3, "device": "0,1"})
    join_round(spec.paths, "fast")
    mark_round_started(spec.paths, 1)
    say_alive(spec.paths.for_node(0), 7)  # and never again
    clock = Clock()
    children = [
        ScriptedChild(clock, {}, exit_at=1, code=1),  # round 1: node 0 went, our ranks crashed in the all-reduce
        ScriptedChild(clock, {}, exit_at=1, code=1),  # round 2: a crash of our own (node 0 known gone)
        ScriptedChild(clock, {}, exit_at=1, code=errors.NODES_MISSING),  # round 3: node 0 did not come
    ]
    result, made = supervise(spec, children, clock, config=replace(CONFIG, max_restarts=3))
    assert [(s.nodes.round, s.profile) for s in made] == [(1, "fast"), (2, "fast"), (3, "safe")]
    assert result.exit_code == errors.FAILED and result.restarts == 1  # the second crash only
    assert [f.attempt for f in result.failures] == [2]  # the first was node 0's loss: nothing diagnosed


def _supervisor(spec, child, clock, sleep, stop_self) -> Supervisor:
    return Supervisor(
        spec,
        CONFIG,
        child_factory=lambda s, c: child,
        clock=clock,
        sleep=sleep,
        log=RunLog(stream=open(os.devnull, "w")),
        stop_self=stop_self,
    )


def test_a_terminal_that_closes_on_a_stopped_job_stops_the_run_as_a_hang_up_and_the_tree_trains_no_more(spec):
    """Ctrl-Z, then the terminal closes: bash sends SIGHUP, SIGTERM and SIGCONT at once. The hang-up is the cause
    (129, not 143), and the stopped tree is not continued to train: it is stopped."""
    import signal

    clock = Clock()
    child = steady(clock, 200, 1)
    unpaused = []
    child.unpause = lambda: unpaused.append(True)

    def stop_self():  # while the supervisor is stopped, both signals arrive; handled in order when it continues
        sup.signals._on_stop(signal.SIGHUP, None)
        sup.signals._on_stop(signal.SIGTERM, None)

    def sleep(dt):
        clock.sleep(dt)
        if clock.now == 20:
            sup.signals.suspend_requested = True

    sup = _supervisor(spec, child, clock, sleep, stop_self)
    result = sup.run()
    assert result.exit_code == errors.HANGUP == 129 and unpaused == [] and child.killed


def test_a_background_write_with_tostop_stops_the_tree_with_the_supervisor_and_is_no_hang(spec):
    """SIGTTOU (stty tostop): the tree is stopped at once with the supervisor, as a plain job stops, and goes on
    with it; the time stopped is no time without progress."""
    import signal

    clock = Clock()
    child = steady(clock, 200, 1)
    seen = []

    def stop_self():
        seen.append(child.paused)
        clock.now += 1000  # stopped for longer than any stall timeout

    def sleep(dt):
        clock.sleep(dt)
        if clock.now == 30:
            sup.signals._on_terminal(signal.SIGTTOU, None)  # what the kernel does at the supervisor's write

    sup = _supervisor(spec, child, clock, sleep, stop_self)
    sup.signals.install = lambda: {}
    result = sup.run()
    assert seen == [True] and child.paused is False
    assert result.exit_code == errors.OK and result.hangs == [] and sup.signals.suspended_seconds >= 0


def test_a_tree_that_waits_for_its_terminal_to_take_its_output_is_not_hung(spec):
    """Ctrl-S: the trainer blocks writing to its terminal; silent for longer than the stall timeout, it is no hang."""
    clock = Clock()
    child = ScriptedChild(clock, {5: beat(1), 300: beat(2, batch=2, batches_total=2)}, exit_at=305)

    def sleep(dt):
        clock.sleep(dt)
        child.terminal_blocked = 10 < clock.now < 290  # Ctrl-S at 10 s, Ctrl-Q at 290 s

    result = _supervisor(spec, child, clock, sleep, stop_self=lambda: None).run()
    assert result.exit_code == errors.OK and result.hangs == []


class _Tree:
    """A training tree that records its pauses."""

    def __init__(self):
        self.calls = []

    def pause(self):
        self.calls.append("pause")

    def unpause(self):
        self.calls.append("unpause")


def test_a_write_retried_while_the_job_stops_stops_it_once_and_counts_its_time_once(monkeypatch):
    """Issue 43: the thread relaying the trainer's stderr retries its write, and each try raises SIGTTOU again; each
    re-entered the handler while it stopped the job: 29 fg's to continue, the time stopped counted 29 times."""
    import signal
    from types import SimpleNamespace

    from rocm_yolo.supervisor import signals as module
    from rocm_yolo.supervisor.signals import Signals

    clock = Clock()
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: clock.now))
    stops = []
    terminal = {"foreground": False}

    def stop_self():  # stopped; the retried writes raise SIGTTOU again meanwhile; then fg
        stops.append(1)
        for _ in range(28):
            signals._on_terminal(signal.SIGTTOU, None)
            clock.now += 1  # stopped for 28 s in all
        terminal["foreground"] = True  # fg: the job is the terminal's foreground job, and continued

    signals = Signals(stop_self, foreground=lambda: terminal["foreground"])
    signals.child = tree = _Tree()
    signals._on_terminal(signal.SIGTTOU, None)
    for _ in range(28):  # the signals still pending once continued: the same stop's
        signals._on_terminal(signal.SIGTTOU, None)
    assert stops == [1] and tree.calls == ["pause", "unpause"] and signals.terminal_stops == [signal.SIGTTOU]
    assert signals.suspended_seconds == signals.unaccounted == 28  # once, not once per signal
    terminal["foreground"] = False  # bg: continued in the background, the next write stops the job again
    signals._on_terminal(signal.SIGTTOU, None)
    assert stops == [1, 1] and tree.calls == ["pause", "unpause", "pause", "unpause"]


def test_a_hangup_while_stopped_for_terminal_output_leaves_the_tree_stopped_for_the_stop():
    """The terminal went away while the job was stopped: its SIGHUP (then SIGCONT) is the cause; the tree is not
    continued to train, it is stopped (the loop kills it: exit 129)."""
    import signal

    from rocm_yolo.supervisor.signals import Signals

    signals = Signals(lambda: signals._on_stop(signal.SIGHUP, None), foreground=lambda: None)
    signals.child = tree = _Tree()
    signals._on_terminal(signal.SIGTTOU, None)
    assert tree.calls == ["pause"] and signals.exit_code() == errors.HANGUP == 129


def test_on_several_machines_ranks_failed_in_a_collective_follow_the_node_that_restarted_first(spec):
    """Node 1's ranks failed in a collective (gloo lost its connection to node 0's ranks) while node 0, whose own
    failure it was, restarted first and opened round 2: node 1 follows it there on that round's profile, with no
    remedy of its own (not NCCL_P2P_DISABLE) and no restart spent. Alone (no round opened), the same failure is a
    collective failure of its own."""
    from rocm_yolo.run.nodes import Nodes, join_round, mark_round_started

    nodes = Nodes(count=2, node=1, endpoint="127.0.0.1:29400", round=1)
    spec = replace(spec, nodes=nodes, train_args={"epochs": 3, "device": "0,1"})
    join_round(spec.paths, "fast")
    mark_round_started(spec.paths, 1)
    join_round(spec.paths.for_node(0), "safe", after=1)  # node 0 restarted first, and opened round 2
    gloo = "RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [10.0.0.1]:4242"
    clock = AliveNode(spec.paths.for_node(0))
    children = [
        ScriptedChild(clock, {}, exit_at=1, code=1, stderr=gloo),
        ScriptedChild(clock, {}, exit_at=1, code=errors.NODES_MISSING),
    ]
    result, made = supervise(spec, children, clock, config=replace(CONFIG, max_restarts=3))
    assert [(s.nodes.round, s.profile) for s in made] == [(1, "fast"), (2, "safe")]
    assert result.restarts == 0 and result.failures == [] and "NCCL_P2P_DISABLE" not in made[1].env
