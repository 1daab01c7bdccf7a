"""The run's events as JSON lines and its Prometheus textfile."""

from __future__ import annotations

import json
from collections import Counter

from fakes import beat
from rocm_yolo.run.events import RunLog, read_events
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.reporting import Reporter, render


def test_events_carry_the_keys_a_notify_command_gets_and_restarts_count_by_class(tmp_path):
    paths = RunPaths(tmp_path / "run")
    log = RunLog(paths.log, paths.events, stream=open("/dev/null", "w"))
    reporter = Reporter(paths, WatchdogConfig(), log)
    reporter.event("restart", "restart 1/3", attempt=2, profile="fast", cls="gpu-fault", resume=None)
    reporter.event("finished", None, attempt=2, profile="fast", say=False, exit_code=0)
    reporter.close()
    restart, finished = read_events(paths.events)
    assert restart["event"] == "restart" and restart["class"] == "gpu-fault" and restart["message"] == "restart 1/3"
    assert restart["run"] == str(paths.run_dir.resolve()) and restart["attempt"] == 2 and "resume" in restart
    assert finished["exit_code"] == 0 and "class" not in finished
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
    assert 'rocm_yolo_restarts_total{run="/runs/a \\"b\\""} 0' in text
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert all(len(line.rsplit(" ", 1)) == 2 and float(line.rsplit(" ", 1)[1]) >= 0 for line in samples)
    assert json.dumps(text)  # plain text
