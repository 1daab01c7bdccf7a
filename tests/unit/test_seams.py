"""The tests' seams (tests/seams) load together: Python imports only the first sitecustomize on its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SEAMS = Path(__file__).resolve().parents[1] / "seams"

CHECK = """
from rocm_yolo.supervisor.config import WatchdogConfig
from ultralytics.utils.torch_utils import select_device
try:
    device = select_device("0,1", verbose=False)
except Exception:
    device = "refused"
c = WatchdogConfig()
print(c.kernel_log, c.proc_root, c.cgroup_root, device)
"""


def run(extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCM_YOLO_TEST_")}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(SEAMS), os.environ.get("PYTHONPATH")) if x)
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], env={**env, **extra}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()[-1].split()  # the last line: the check's own


def test_every_seam_in_one_process(tmp_path):
    log, proc, cg = tmp_path / "kern.log", tmp_path / "proc", tmp_path / "cgroup"
    seams = {
        "ROCM_YOLO_TEST_CPU_DDP": "1",
        "ROCM_YOLO_TEST_KERNEL_LOG": str(log),
        "ROCM_YOLO_TEST_PROC_ROOT": str(proc),
        "ROCM_YOLO_TEST_CGROUP_ROOT": str(cg),
    }
    assert run(seams) == [str(log), str(proc), str(cg), "cpu"]


def test_no_seam_unless_its_variable_is_set():
    kernel_log, proc, cg, device = run({})
    assert kernel_log == proc == cg == "None" and device != "cpu"  # this machine has no GPU 0,1: refused without it
