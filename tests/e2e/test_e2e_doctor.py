"""End to end, the doctor's DataLoader checks: Ultralytics' own dataset in real subprocesses, a real
multi-process hang, and nothing left behind (counted with psutil)."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from helpers import descendants
from rocm_yolo import doctor
from rocm_yolo.doctor import FAIL, OK


def _loader_skip():
    return ",".join(c for c in doctor.CHECKS if c not in ("loader",))


@pytest.mark.e2e
def test_healthy_loader_single_and_forkserver_workers(demo, capsys):
    before = descendants()
    code = doctor.main(
        [str(demo), "--workers", "1", "--batch", "2", "--timeout", "60", "--json", "--skip", _loader_skip()]
    )
    report = json.loads(capsys.readouterr().out)
    rows = {r["check"]: r for r in report["rows"]}
    assert code == 0 and report["exit_code"] == 0, report
    assert rows["loader.single"]["status"] == OK and rows["loader.multi"]["status"] == OK
    assert rows["loader.multi"]["found"].startswith("1 forkserver worker: ")  # as training starts them
    assert rows["loader.startup"]["status"] == OK
    assert descendants() <= before


@pytest.mark.e2e
def test_multiprocess_hang_is_reported_and_nothing_is_left(demo, capsys, monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_PLUGINS", "rocm_yolo.testing")
    monkeypatch.setenv("ROCM_YOLO_FAULT", "worker-hang")
    before = descendants()
    started = time.monotonic()
    code = doctor.main(
        [str(demo), "--workers", "2", "--batch", "2", "--timeout", "20", "--json", "--skip", _loader_skip()]
    )
    report = json.loads(capsys.readouterr().out)
    rows = {r["check"]: r for r in report["rows"]}
    assert code == doctor.EXIT_PROBLEMS == report["exit_code"]
    assert rows["loader.single"]["status"] == OK
    assert rows["loader.multi"]["status"] == FAIL and "hang" in rows["loader.multi"]["found"]
    assert report["conclusion"].endswith("single-process works, multi-process hangs: use --profile single")
    assert time.monotonic() - started < 120
    time.sleep(0.2)
    assert descendants() <= before
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "probe_main" in " ".join(p.info["cmdline"] or [])]
    assert not leftovers
