"""The run's events as JSON lines and its Prometheus textfile: exact values, stable series, events in time order and
where the run was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import Clock, ScriptedChild, beat
from rocm_yolo import errors
from rocm_yolo.diagnosis.classes import NAMES as CLASSES
from rocm_yolo.diagnosis.evidence import Machine
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.loop import Supervisor
from rocm_yolo.supervisor.reporting import Reporter, render

CONFIG = WatchdogConfig(stall_timeout=60, startup_grace=300, max_restarts=3, poll_interval=1)
HSA = "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000. Reason: Page.\n"
T = 1_795_740_123.456789  # a heartbeat's wall clock: {:g} wrote it 1.79574e+09, 3,293 s off


def samples(text: str) -> dict:
    """The textfile as Prometheus' own parser reads it: {(name, labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def restarts(text: str) -> dict:
    return {
        dict(labels)["class"]: v for (name, labels), v in samples(text).items() if name == "rocm_yolo_restarts_total"
    }


def test_events_carry_the_keys_a_notify_command_gets_and_restarts_count_by_class(tmp_path):
    paths = RunPaths(tmp_path / "run")
    log = RunLog(paths.log, paths.events, stream=open(os.devnull, "w"))
    reporter = Reporter(paths, WatchdogConfig(), log)
    reporter.event("restart", "restart 1/3", attempt=2, profile="fast", cls="gpu-fault", resume=None, epoch=2, batch=3)
    reporter.event("finished", None, attempt=2, profile="fast", say=False, exit_code=0, epoch=None, batch=None)
    reporter.close()
    restart, finished = read_events(paths.events)
    assert restart["event"] == "restart" and restart["class"] == "gpu-fault" and restart["message"] == "restart 1/3"
    assert restart["run"] == str(paths.run_dir.resolve()) and restart["attempt"] == 2 and "resume" in restart
    assert (restart["epoch"], restart["batch"]) == (2, 3)
    assert finished["exit_code"] == 0 and not {"class", "epoch", "batch"} & set(finished)  # unknown: no null
    text = paths.metrics.read_text()
    assert 'rocm_yolo_restarts_total{run="%s",class="gpu-fault"} 1' % paths.run_dir.resolve() in text
    assert 'state="finished"} 1' in text and "rocm_yolo_up{" in text and text.rstrip().endswith(tuple("0123456789"))
    assert not list(paths.state.glob(".*.tmp"))  # written atomically: no temporary left


def test_the_textfile_has_the_heartbeat_and_escapes_its_labels():
    hb = beat(7, epoch=2, batch=3, batches=16, it_s=2.5, t=100.0)
    text = render('/runs/a "b"', hb, "running", Counter(), attempt=1, now=130.0)
    assert 'rocm_yolo_epoch{run="/runs/a \\"b\\""} 2' in text
    assert 'rocm_yolo_heartbeat_age_seconds{run="/runs/a \\"b\\""} 30' in text
    assert 'rocm_yolo_iterations_per_second{run="/runs/a \\"b\\""} 2.5' in text
    assert 'rocm_yolo_restarts_total{run="/runs/a \\"b\\"",class="loader"} 0' in text
    found = samples(text)
    assert found[("rocm_yolo_epoch", (("run", '/runs/a "b"'),))] == 2
    assert json.dumps(text)  # plain text


def test_every_value_is_exact_and_the_restarts_series_stay_the_same_after_a_restart():
    hb = beat(7, epoch=2, batch=3, batches=16, it_s=2.345678, t=T)
    before = render("/r", hb, "running", Counter(), attempt=1, now=T + 1.25)
    found = samples(before)
    assert found[("rocm_yolo_heartbeat_timestamp_seconds", (("run", "/r"),))] == T
    assert found[("rocm_yolo_metrics_timestamp_seconds", (("run", "/r"),))] == T + 1.25
    assert found[("rocm_yolo_iterations_per_second", (("run", "/r"),))] == 2.345678
    assert f"}} {T!r}\n" in before and "e+09" not in before
    assert restarts(before) == dict.fromkeys(CLASSES, 0)  # one series per class from the first write, each from 0
    after = render("/r", hb, "running", Counter(loader=1), attempt=2, now=T + 9)
    assert restarts(after) == {**dict.fromkeys(CLASSES, 0), "loader": 1}  # the same series, one of them counted


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (Debian: apt install prometheus)"
)
def test_the_textfile_passes_promtool():
    text = render('/runs/a "b"', beat(7, epoch=2, t=T), "running", Counter(gpu_fault=1), attempt=2, now=T + 2)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def _run(spec, children, config, clock, **kw):
    made = iter(children)
    sup = Supervisor(
        spec,
        config,
        child_factory=lambda s, c: next(made),
        clock=clock,
        sleep=kw.pop("sleep", clock.sleep),
        log=RunLog(spec.paths.log, spec.paths.events, stream=open(os.devnull, "w")),
        machine=Machine(),
        **kw,
    )
    return sup, sup.run()


def test_a_run_with_a_restart_says_where_it_was_in_every_event_in_time_order_and_metrics_come_first(spec, tmp_path):
    """A crash at epoch 2, batch 3, a restart, the end at epoch 3: each event says where the run was (the restart:
    where the failed attempt was), none has a null; events.jsonl is in time order (a failure's notice is its
    ``detected``); the notify command finds metrics.prom already saying the event, with the same restart series
    before and after the restart."""
    heard = tmp_path / "heard"
    heard.mkdir()
    config = replace(
        CONFIG, notify=f"n=$(ls {heard} | wc -l); cat > {heard}/$n.json; cp {spec.paths.metrics} {heard}/$n.prom"
    )
    clock = Clock()
    failing = ScriptedChild(clock, {5: beat(1, epoch=2, batch=3, t=T)}, exit_at=8, code=-6, stderr=HSA)
    healthy = ScriptedChild(clock, {15: beat(1, epoch=3, batch=16, batches=16, phase="done", t=T + 20)}, exit_at=18)
    sup, result = _run(spec, [failing, healthy], config, clock)
    assert result.exit_code == errors.OK
    events = read_events(spec.paths.events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    told = [e for e in events if e["event"] in ("started", "crash", "restart", "finished")]
    assert [e["event"] for e in told] == ["started", "crash", "restart", "finished"]
    assert not [e for e in events if None in (e.get("epoch", 0), e.get("batch", 0))]
    _, crash, restart, finished = told
    assert (crash["epoch"], crash["batch"], crash["phase"]) == (2, 3, "train") and crash["detected"] <= crash["time"]
    assert (restart["epoch"], restart["batch"], restart["class"]) == (2, 3, "gpu-fault")
    assert (finished["epoch"], finished["batch"], finished["phase"]) == (3, 16, "done")
    said = [json.loads((heard / f"{2 * i}.json").read_text()) for i in range(4)]
    assert [e["event"] for e in said] == ["started", "crash", "restart", "finished"] and said[2]["epoch"] == 2
    proms = [(heard / f"{2 * i}.prom").read_text() for i in range(4)]
    assert list(restarts(proms[0])) == list(CLASSES)  # (a copy may be later than its event: the series are the same)
    assert restarts(proms[2]) == restarts(proms[3]) == {**dict.fromkeys(CLASSES, 0), "gpu-fault": 1}
    assert 'state="finished"} 1' in proms[3]  # written before the command heard "finished"
    final = samples(spec.paths.metrics.read_text())
    assert final[("rocm_yolo_heartbeat_timestamp_seconds", (("run", str(spec.paths.run_dir.resolve())),))] == T + 20


def test_a_stopped_run_says_where_it_was_and_the_time_stopped_by_ctrl_z_is_not_the_runs(spec):
    clock = Clock()
    child = ScriptedChild(clock, {5: beat(1, epoch=2, batch=7, t=T)})
    holder = {}

    def stop_self():  # Ctrl-Z: the shell continues the job 1000 s later
        clock.now += 1000

    def sleep(dt):
        clock.sleep(dt)
        if clock.now == 10:
            holder["sup"].signals.suspend_requested = True
        if clock.now == 1020:
            holder["sup"].signals.interrupted = 15  # then SIGTERM

    made = iter([child])
    sup = Supervisor(
        spec,
        CONFIG,
        child_factory=lambda s, c: next(made),
        clock=clock,
        sleep=sleep,
        log=RunLog(spec.paths.log, spec.paths.events, stream=open(os.devnull, "w")),
        machine=Machine(),
        stop_self=stop_self,
    )
    holder["sup"] = sup
    result = sup.run()
    assert result.exit_code == errors.TERMINATED and result.suspended_seconds == 1000
    assert result.running_seconds == max(result.wall_seconds - 1000, 0.0)
    [stopped] = [e for e in read_events(spec.paths.events) if e["event"] == "stopped"]
    assert (stopped["epoch"], stopped["batch"], stopped["phase"], stopped["exit_code"]) == (2, 7, "train", 143)
