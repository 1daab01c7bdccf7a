"""Memory of a training run's process tree: plain Ultralytics (workers by fork) against rocm-yolo (the fork server).

rocm-yolo's DataLoader workers come from a fork server that imported torch and Ultralytics but never touched the
GPU; plain Ultralytics forks its workers from the trainer. The fork server is a process more, and its workers share
its pages, not the trainer's: this measures what that costs. Each side runs in a fresh process tree, the sides in
turn each round; every 0.5 s the PSS (proportional set size: a page shared by N processes counts 1/N in each, so
the sum over a tree is what the tree holds) of every process of the tree is summed. Reported per side: the peak and
the median of the samples taken while it trained (from the first results.csv row on), in MiB, median (min-max)
over rounds, and rocm-yolo's minus plain's per round.

Not a test: run it by hand on a quiet machine and paste the table into the docs.

    python benchmarks/bench_memory.py                      # workers 2, synthetic data, CPU
    python benchmarks/bench_memory.py --workers 4 --rounds 3 --epochs 6
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TAG_VAR, interleaved, machine_line, stop_on_signals  # noqa: E402
from bench_train import plain_cmd, rocm_cmd  # noqa: E402

from rocm_yolo.process.tagged import Tagged  # noqa: E402

SIDES = ("plain-W", "fast")
MIB = 2**20


def tree_pss(root: psutil.Process) -> int:
    """The PSS of ``root`` and every descendant, in bytes (a process gone meanwhile counts 0)."""
    total = 0
    try:
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in members:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            continue
    return total


def one_run(a, side: str, rnd: int, data: Path, root: Path) -> tuple[float, float]:
    """(peak, median while training) of the tree's PSS in MiB."""
    project, name = root / side, f"r{rnd}"
    project.mkdir(parents=True, exist_ok=True)
    cmd = (plain_cmd if side.startswith("plain") else rocm_cmd)(a, data, side, project, name)
    tagged, log = Tagged(TAG_VAR), root / f"{side}-{name}.log"
    proc = None
    samples, training = [], []
    try:
        with open(log, "w") as out:
            proc = tagged.start(cmd, cwd=root, output=out)
            tree = psutil.Process(proc.pid)
            deadline = time.monotonic() + a.timeout
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{side} run {name} did not finish in {a.timeout:g} s; its log: {log}")
                pss = tree_pss(tree)
                samples.append(pss)
                if (project / name / "results.csv").exists():  # an epoch is done: the tree is at its working size
                    training.append(pss)
                time.sleep(0.5)
        if proc.returncode != 0:
            raise SystemExit(f"{side} run {name} exited with {proc.returncode}; log {log}")
    finally:
        tagged.stop(proc)
    peak, during = max(samples) / MIB, statistics.median(training or samples) / MIB
    print(f"  round {rnd} {side:8s}: peak {peak:7.0f} MiB, median while training {during:7.0f} MiB", flush=True)
    return peak, during


def spread(xs: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def report(a, results: dict) -> list[str]:
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
    plain, ours = results["plain-W"], results["fast"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line()}",
        "",
        f"Settings: synthetic data, {a.train} train images, imgsz {a.imgsz}, batch {a.batch}, {a.workers} workers, "
        f"device {a.device}, {a.epochs} epochs, val=False, {a.rounds} interleaved round(s); the tree's PSS in MiB, "
        "median (min-max) over rounds",
        "",
        "| side | peak | while training |",
        "| --- | --- | --- |",
        f"| plain Ultralytics, `workers={a.workers}` (fork) | {spread([p for p, _ in plain])} | "
        f"{spread([d for _, d in plain])} |",
        f"| rocm-yolo `--profile fast --workers {a.workers}` (fork server) | {spread([p for p, _ in ours])} | "
        f"{spread([d for _, d in ours])} |",
        f"| rocm-yolo - plain, per round | {spread([o[0] - p[0] for o, p in zip(ours, plain)], '{:+.0f}')} | "
        f"{spread([o[1] - p[1] for o, p in zip(ours, plain)], '{:+.0f}')} |",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of both sides (default: 2)")
    p.add_argument("--device", default="cpu", help="device of every run (default: cpu)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both sides (default: 3)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--train", type=int, default=64, help="train images in the generated data set (default: 64)")
    p.add_argument("--val", type=int, default=16)
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before one run is killed (default: 900)")
    a = p.parse_args(argv)
    a.threads = None  # what bench_train's command builders read
    stop_on_signals()
    if a.rounds < 1 or a.workers < 1 or a.epochs < 2:
        p.error("--rounds and --workers must be >= 1, --epochs >= 2")
    return interleaved(a, "bench-memory-", SIDES, one_run, report, val=a.val)


if __name__ == "__main__":
    sys.exit(main())
