"""Per-epoch training time: plain Ultralytics vs rocm-yolo, interleaved, each run in a fresh process.

Rounds alternate plain, rocm, plain, rocm, ... so a slow phase of the machine hits both sides.
Per-epoch time is the difference of the cumulative ``time`` column of Ultralytics' results.csv;
epoch 1 (worker start-up, first-call costs) is left out, and so is the last epoch, which holds
the final validation Ultralytics runs even with ``val=False``. Two settings:

- workers=0: plain ``YOLO(...).train(workers=0)`` vs ``rocm-yolo --profile single``: rocm-yolo's
  own overhead (supervisor process, heartbeat and hook callbacks, patches);
- workers=2: plain Ultralytics with 2 workers (its default fork start method; a callback undoes
  its workers=0 on the CPU) vs ``rocm-yolo --profile fast --workers 2`` (spawn, persistent).

Not a test: run it by hand on a quiet machine and paste the table into the docs.

    python benchmarks/bench_train.py                       # both settings, 3 rounds, ~5-8 min on 2 cores
    python benchmarks/bench_train.py --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interrupted, machine_line, run_logged, stop_on_signals, work_dir  # noqa: E402

PLAIN_RUNNER = """\
import json, sys
from ultralytics import YOLO
args = json.loads(sys.argv[1])
workers = args["workers"]
model = YOLO("yolo26n.yaml")
def restore_workers(trainer):  # Ultralytics sets workers=0 on the CPU in BaseTrainer.__init__
    trainer.args.workers = workers
model.add_callback("on_pretrain_routine_start", restore_workers)
model.train(**args)
"""


# one run -------------------------------------------------------------------------------------
def epoch_times(results: Path) -> list[float]:
    with open(results) as f:
        cumulative = [float(row["time"]) for row in csv.DictReader(f, skipinitialspace=True)]
    return [b - a for a, b in zip([0.0, *cumulative], cumulative)]


def train_args(a, data: Path, workers: int) -> dict:
    return {"data": str(data), "epochs": a.epochs, "imgsz": a.imgsz, "batch": a.batch, "device": "cpu",
            "workers": workers, "val": False, "plots": False}


def plain_cmd(a, data: Path, workers: int, project: Path, name: str) -> list[str]:
    args = {**train_args(a, data, workers), "project": str(project), "name": name, "exist_ok": True}
    return [sys.executable, "-c", PLAIN_RUNNER, json.dumps(args)]


def rocm_cmd(a, data: Path, workers: int, project: Path, name: str) -> list[str]:
    t = train_args(a, data, workers)
    profile = ["--profile", "single"] if workers == 0 else ["--profile", "fast", "--workers", str(workers)]
    return [sys.executable, "-m", "rocm_yolo", "train", t["data"], "--model", "yolo26n.yaml", *profile,
            "--device", "cpu", "--epochs", str(a.epochs), "--imgsz", str(a.imgsz), "--batch", str(a.batch),
            "val=False", "plots=False", "--project", str(project), "--name", name]


def one_run(a, side: str, workers: int, rnd: int, data: Path, root: Path) -> list[float]:
    project, name = root / side, f"w{workers}-r{rnd}"
    cmd = (plain_cmd if side == "plain" else rocm_cmd)(a, data, workers, project, name)
    project.mkdir(parents=True, exist_ok=True)
    log = root / f"{side}-{name}.log"
    t0 = time.monotonic()
    code = run_logged(cmd, root, log, a.timeout)
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"{side} run {name} exited with {code}; log {log}:\n{tail}")
    times = epoch_times(project / name / "results.csv")
    print(f"  round {rnd} {side:5s} workers={workers}: {time.monotonic() - t0:5.1f} s wall, epochs "
          + " ".join(f"{t:.2f}" for t in times), flush=True)
    return times


# report --------------------------------------------------------------------------------------
def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def report(a, results: dict) -> list[str]:
    measured = list(range(1, a.epochs - 1))  # 0-based epoch indices: not the first, not the last (final val)
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
    lines = [f"Command: `{command}`",
             "", f"Machine: {machine_line()}", "",
             f"Settings: {a.train} train images, imgsz {a.imgsz}, batch {a.batch}, {a.epochs} epochs, val=False, "
             f"plots=False, {a.rounds} interleaved round(s); epoch time in s, median (min-max) over rounds; "
             f"epochs {measured[0] + 1}-{measured[-1] + 1} measured (epoch 1: start-up; epoch {a.epochs}: final val)",
             "", "| setting | epoch | plain s | rocm-yolo s | rocm/plain |", "| --- | --- | --- | --- | --- |"]
    for workers, sides in results.items():
        label = ("workers=0: plain vs `--profile single`" if workers == 0 else
                 f"workers={workers}: plain (fork) vs `--profile fast --workers {workers}` (spawn, persistent)")
        for e in measured:
            p = [run[e] for run in sides["plain"]]
            r = [run[e] for run in sides["rocm"]]
            ratios = [y / x for x, y in zip(p, r)]
            lines.append(f"| {label} | {e + 1} | {spread(p)} | {spread(r)} | {spread(ratios, '{:.3f}')} |")
        per_round = [statistics.mean(r[e] for e in measured) / statistics.mean(p[e] for e in measured)
                     for p, r in zip(sides["plain"], sides["rocm"])]
        lines.append(f"| {label} | **all** | | | **{spread(per_round, '{:.3f}')}** |")
    lines += ["", "rocm/plain per epoch: ratio of each interleaved pair, median (min-max); **all**: ratio of the "
              "mean measured epoch time per pair. < 1 means rocm-yolo is faster."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="settings to run (default: 0 2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved plain/rocm pairs per setting (default: 3)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per run, >= 3 (default: 4)")
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--train", type=int, default=64, help="train images in the generated data set (default: 64)")
    p.add_argument("--val", type=int, default=16, help="val images (default: 16)")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before one run is killed (default: 600)")
    a = p.parse_args(argv)
    stop_on_signals()
    if a.epochs < 3:
        p.error("--epochs must be >= 3 (epoch 1 and the last epoch are not measured)")
    if a.rounds < 1 or any(w < 0 for w in a.workers):
        p.error("--rounds must be >= 1 and --workers >= 0")

    try:
        with work_dir(a.dir, "bench-train-") as root:
            from rocm_yolo.demo import write_demo

            data = write_demo(root / "data", train=a.train, val=a.val, size=max(a.imgsz, 64))
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            results: dict = {}
            started = time.monotonic()
            for workers in a.workers:
                results[workers] = {"plain": [], "rocm": []}
                for rnd in range(1, a.rounds + 1):
                    for side in ("plain", "rocm"):
                        results[workers][side].append(one_run(a, side, workers, rnd, data, root))
            print(f"\ntotal {time.monotonic() - started:.0f} s\n")
            print("\n".join(report(a, results)))
            return 0
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
