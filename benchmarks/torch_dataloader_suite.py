"""PyTorch's own DataLoader tests, plain and under rocm-yolo's DataLoader patch: outcome and time of each test.

torch's ``test/test_dataloader.py`` is torch's code, not ours: fetch it for the torch you have
(``https://github.com/pytorch/pytorch/blob/v<version>/test/test_dataloader.py``) and pass its path.
It needs ``expecttest`` (``pip install expecttest``) for torch's test helpers.

Each side runs the file once with pytest in a fresh process. The patched side puts a
``sitecustomize`` on ``PYTHONPATH`` that, in the test process and in every process it spawns
(torch's tests run loaders inside spawned processes), does what the training child does before
training: start the preloaded fork server, then install the DataLoader patch with a profile's
settings (``--profile``, default ``fast``). Per-test outcomes and times come from pytest's JUnit XML.

    python benchmarks/torch_dataloader_suite.py /path/to/test_dataloader.py
    python benchmarks/torch_dataloader_suite.py /path/to/test_dataloader.py -k "timeout or segfault"
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from _common import machine_line, run_logged

SITECUSTOMIZE = '''\
"""rocm-yolo's patches in the test process and the processes it spawns (benchmarks only)."""
import os

def _install():
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read()
    if b"pytest" not in cmdline and b"spawn_main" not in cmdline:
        return  # only the tests' own processes: not the fork server, multiprocessing's resource tracker, ...
    import tempfile
    from rocm_yolo.trainer.forkserver import server as forkserver
    run = tempfile.mkdtemp(prefix="run-", dir=os.environ["ROCM_YOLO_SUITE_RUNS"])
    forkserver.start(run)  # as the training child: before torch is imported
    from rocm_yolo.patches.loaders import dataloader
    from rocm_yolo.policy.profiles import resolve
    dataloader.install(resolve(os.environ["ROCM_YOLO_SUITE_PROFILE"], 2).loader, run)

if os.environ.get("ROCM_YOLO_SUITE_RUNS"):
    _install()
'''


def run_side(test_file: Path, work: Path, side: str, profile: str, select: str | None, timeout: float) -> dict:
    """{test id: (outcome, seconds)} of one pytest run of ``test_file``."""
    report = work / f"{side}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(test_file)]
    if select:
        cmd += ["-k", select]
    env = {}
    if side == "patched":
        site = work / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        runs = work / "runs"
        runs.mkdir(exist_ok=True)
        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "ROCM_YOLO_SUITE_RUNS": str(runs),
            "ROCM_YOLO_SUITE_PROFILE": profile,
        }
    run_logged(cmd, test_file.parent, work / f"{side}.log", timeout, env)
    if not report.exists():
        raise SystemExit(f"pytest wrote no report for the {side} side: see {work / f'{side}.log'}")
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
        results[f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"] = (outcome, float(case.get("time")))
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("test_file", type=Path, help="torch's test/test_dataloader.py for the installed torch")
    p.add_argument("-k", dest="select", help="pytest -k expression: the tests to run (default: all)")
    p.add_argument("--profile", default="fast", help="the profile whose loader settings the patch applies")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per side")
    p.add_argument("--dir", type=Path, help="keep the logs and reports here (default: a temporary directory)")
    a = p.parse_args()
    if not a.test_file.is_file():
        print(f"error: {a.test_file} is not a file: pass the path of torch's test/test_dataloader.py", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="torch-suite-") as tmp:
        work = a.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        plain = run_side(a.test_file.resolve(), work, "plain", a.profile, a.select, a.timeout)
        patched = run_side(a.test_file.resolve(), work, "patched", a.profile, a.select, a.timeout)
    print(f"torch's DataLoader tests, plain and patched (profile {a.profile}); {machine_line()}\n")
    print("| test | plain | patched | time plain (s) | time patched (s) |")
    print("|---|---|---|---:|---:|")
    for test in sorted(set(plain) | set(patched)):
        (po, pt), (qo, qt) = plain.get(test, ("-", 0.0)), patched.get(test, ("-", 0.0))
        print(f"| {test} | {po} | {qo} | {pt:.2f} | {qt:.2f} |")
    differ = [t for t in plain if plain[t][0] == "passed" and patched.get(t, ("-",))[0] != "passed"]
    print(f"\n{len(differ)} test(s) pass plain and not patched" + (f": {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
