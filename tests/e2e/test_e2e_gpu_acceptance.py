"""End to end: ``benchmarks/gpu_acceptance.py --dry-run``, the lent GPU's one command, at toy size on the CPU.

The script only runs for real when a GPU is lent, rarely and for minutes: this test runs its dry run, so that it
cannot rot in between. Every step's section is in the report, with a figure where a CPU can run the step and the
reason where it cannot; step 6's failure is a corpus case; nothing the script started is left running.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from helpers import TAG_VAR
from rocm_yolo.process.tagged import Tagged

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_acceptance.py"
RUNS_ON_A_CPU = (1, 2, 3, 5, 6, 8)  # 4 (GPU memory), 7 (two GPUs) and step 6's out-of-memory need a GPU
CORPUS_FIELDS = {"id", "source", "label", "failure", "exit", "on_gpu", "multi_gpu", "text", "remedy", "why"}


def sections(report: str) -> dict[int, str]:
    parts = re.split(r"^## (\d)\. ", report, flags=re.M)
    return {int(n): text for n, text in zip(parts[1::2], parts[2::2])}


def status(section: str) -> str:
    return re.search(r"^Status: (.*)$", section, re.M)[1]


def test_the_dry_run_reports_every_step_and_leaves_nothing_running(tmp_path):
    tagged = Tagged(TAG_VAR)
    out = tmp_path / "out.txt"
    try:
        with open(out, "w") as f:
            proc = tagged.start([sys.executable, str(SCRIPT), "--dry-run", "report"], cwd=tmp_path, output=f)
        code = proc.wait(timeout=600)
        left = tagged.leftovers()
    finally:
        tagged.kill()
    printed = out.read_text(errors="replace")
    assert code == 0, printed[-4000:]
    assert left == [], f"left running: {[p.cmdline() for p in left]}"

    report = (tmp_path / "report" / "gpu-acceptance.md").read_text()
    found = sections(report)
    assert sorted(found) == list(range(1, 9)), report
    for n in RUNS_ON_A_CPU:
        assert status(found[n]).startswith("done"), f"step {n}:\n{found[n]}"
        assert re.search(r"^\|.*\d.*\|$", found[n], re.M), f"step {n} has no figure:\n{found[n]}"
    for n in (4, 7):
        assert re.fullmatch(r"skipped: \S.*", status(found[n])), f"step {n}:\n{found[n]}"
    oom = found[6].split("### Out of memory", 1)[1].split("###", 1)[0]
    assert re.search(r"^Status: skipped: \S", oom, re.M), found[6]
    assert "Commands:" in found[2] and "bench_train.py" in found[2]
    assert "ROCM_YOLO_FAULT=worker-hang@1:0" in found[5]  # the seeds' hang before the first batch, recovered

    [case] = [json.loads(line) for line in (tmp_path / "report" / "corpus.jsonl").read_text().splitlines()]
    assert set(case) == CORPUS_FIELDS
    assert case["label"] == "training-error" and case["failure"] == "crash" and case["on_gpu"] is False
    assert "device_assert" in case["text"], case["text"][-2000:]  # the traceback, down to the fault
    assert (tmp_path / "report" / "logs" / "6-assert-supervisor.json").is_file()
