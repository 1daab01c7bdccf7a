"""What the benchmark scripts share: run one command in a fresh process, stop everything it made."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from rocm_yolo.environment import ANY_PLUGIN
from rocm_yolo.process.tagged import Tagged

TAG_VAR = "ROCM_YOLO_BENCH_TAG"


def run_logged(cmd: list[str], cwd: Path, log: Path, timeout: float, env: dict | None = None) -> int:
    """Run ``cmd`` with its output in ``log``; whatever happens, leave none of its processes behind."""
    tagged = Tagged(TAG_VAR)  # every process a run starts inherits it: cleanup finds them all
    proc = None
    try:
        with open(log, "w") as out:
            proc = tagged.start(cmd, cwd=cwd, output=out, extra={ANY_PLUGIN: "1", **(env or {})})  # a bench's plugin
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"a run did not finish in {timeout:g} s (--timeout); its log: {log}") from None
        if code in (130, 143, -signal.SIGINT, -signal.SIGTERM):
            raise KeyboardInterrupt  # stopped from outside (Ctrl-C reaches the whole process group)
        return code
    finally:
        tagged.stop(proc)  # a no-op after a clean exit; on timeout, Ctrl-C or error it stops everything


def size_args(a) -> list[str]:
    """``--epochs E --imgsz S --batch B`` of a ``rocm-yolo train`` command, from the script's arguments."""
    return ["--epochs", str(a.epochs), "--imgsz", str(a.imgsz), "--batch", str(a.batch)]


def machine_line() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            "?",
        )
        if cpuinfo.exists()
        else platform.processor() or "?"
    )
    return (
        f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, torch {version('torch')}, "
        f"ultralytics {version('ultralytics')}, rocm-yolo {version('rocm-yolo')}"
    )


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so a killed benchmark stops its runs too."""

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str):
    """``keep`` (made if missing, kept) or a temporary directory removed at the end."""
    tmp = None if keep else tempfile.TemporaryDirectory(prefix=prefix)
    root = (keep or Path(tmp.name)).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        yield root
    finally:
        if tmp is not None:
            tmp.cleanup()


def interleaved(a, prefix: str, sides, one_run, report, val: int = 16) -> int:
    """The benchmark's rounds: the demo set (``a.train`` images) in the work directory, then each round every
    side once, in turn (``one_run(a, side, round, data, root)``), so a slow phase of the machine hits all sides;
    ``report(a, results)`` prints the table. 130 when interrupted (every run's processes stopped)."""
    try:
        with work_dir(a.dir, prefix) as root:
            from rocm_yolo.request.demo import write_demo

            data = write_demo(root / "data", train=a.train, val=val, size=max(a.imgsz, 64))
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            results: dict = {side: [] for side in sides}
            for rnd in range(1, a.rounds + 1):
                for side in sides:
                    results[side].append(one_run(a, side, rnd, data, root))
            print("\n" + "\n".join(report(a, results)))
            return 0
    except KeyboardInterrupt:
        return interrupted()


def interrupted() -> int:
    print("\ninterrupted: every run's processes are stopped", file=sys.stderr)
    return 130
