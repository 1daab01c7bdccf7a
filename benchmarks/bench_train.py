"""Per-epoch training time: plain Ultralytics vs every rocm-yolo profile, interleaved, each run in a fresh process.

Each round runs every side once, in turn (plain workers=0, plain workers=W, then each profile),
so a slow phase of the machine hits all sides. Per-epoch time is the difference of the
cumulative ``time`` column of Ultralytics' results.csv; epoch 1 (worker start-up, first-call
costs) is left out, and so is the last epoch, which holds the final validation Ultralytics
runs even with ``val=False``. The sides:

- ``plain-0`` / ``plain-W``: plain ``YOLO(...).train(workers=0 / W)``, Ultralytics' default
  fork start method (a callback undoes its workers=0 on the CPU);
- ``fast``, ``safe``, ``threads``, ``single``: ``rocm-yolo train --profile P --workers W``
  (``--workers`` only where the profile has worker processes; ``threads`` uses its own
  thread count, or ``--threads``).

Ratios are taken per round (each side against its reference of the same round), then the
median (min-max) over rounds: ``single`` and ``threads`` against plain workers=0 and against
each other, ``fast`` and ``safe`` against plain workers=W.

Not a test: run it by hand on a quiet machine and paste the table into the docs.

    python benchmarks/bench_train.py                                  # every side, synthetic data, CPU
    python benchmarks/bench_train.py --sides plain-0 single threads --data photos --imgsz 320 --rounds 3
    python benchmarks/bench_train.py --device 0 --data photos --train 1000 --imgsz 640 --batch 32 --workers 8
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
from _common import interrupted, machine_line, run_logged, size_args, stop_on_signals, work_dir  # noqa: E402

PROFILES = ("fast", "safe", "threads", "single")
SIDES = ("plain-0", "plain-W", *PROFILES)
# what each side is compared with, in the same round
REFERENCES = {
    "single": ("plain-0", "threads"),
    "threads": ("plain-0", "single", "fast"),
    "fast": ("plain-W",),
    "safe": ("plain-W", "fast"),
}

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
    return {
        "data": str(data),
        "epochs": a.epochs,
        "imgsz": a.imgsz,
        "batch": a.batch,
        "device": a.device,
        "workers": workers,
        "val": False,
        "plots": False,
    }


def plain_cmd(a, data: Path, side: str, project: Path, name: str) -> list[str]:
    workers = 0 if side == "plain-0" else a.workers
    args = {**train_args(a, data, workers), "project": str(project), "name": name, "exist_ok": True}
    return [sys.executable, "-c", PLAIN_RUNNER, json.dumps(args)]


def rocm_cmd(a, data: Path, side: str, project: Path, name: str) -> list[str]:
    profile = ["--profile", side]
    if side in ("fast", "safe"):
        profile += ["--workers", str(a.workers)]
    elif side == "threads" and a.threads:
        profile += [f"threads={a.threads}"]
    return [
        sys.executable,
        "-m",
        "rocm_yolo",
        "train",
        str(data),
        "--model",
        "yolo26n.yaml",
        *profile,
        "--device",
        a.device,
        *size_args(a),
        "val=False",
        "plots=False",
        "--project",
        str(project),
        "--name",
        name,
    ]


def one_run(a, side: str, rnd: int, data: Path, root: Path) -> list[float]:
    project, name = root / side, f"r{rnd}"
    cmd = (plain_cmd if side.startswith("plain") else rocm_cmd)(a, data, side, project, name)
    project.mkdir(parents=True, exist_ok=True)
    log = root / f"{side}-{name}.log"
    t0 = time.monotonic()
    code = run_logged(cmd, root, log, a.timeout)
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"{side} run {name} exited with {code}; log {log}:\n{tail}")
    times = epoch_times(project / name / "results.csv")
    print(
        f"  round {rnd} {label(a, side):8s}: {time.monotonic() - t0:5.1f} s wall, epochs "
        + " ".join(f"{t:.2f}" for t in times),
        flush=True,
    )
    return times


# report --------------------------------------------------------------------------------------
def label(a, side: str) -> str:
    return f"plain-{a.workers}" if side == "plain-W" else side


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def describe(a, side: str) -> str:
    return {
        "plain-0": "plain Ultralytics, `workers=0`",
        "plain-W": f"plain Ultralytics, `workers={a.workers}` (fork)",
        "fast": f"`--profile fast --workers {a.workers}`",
        "safe": f"`--profile safe --workers {a.workers}`",
        "threads": "`--profile threads`" + (f" `threads={a.threads}`" if a.threads else ""),
        "single": "`--profile single`",
    }[side]


def report(a, results: dict) -> list[str]:
    measured = list(range(1, a.epochs - 1))  # 0-based epoch indices: not the first, not the last (final val)
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
    mean = {side: [statistics.mean(run[e] for e in measured) for run in runs] for side, runs in results.items()}
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line()}",
        "",
        f"Settings: {a.data} data, {a.train} train images, imgsz {a.imgsz}, batch {a.batch}, device {a.device}, "
        f"{a.epochs} epochs, val=False, plots=False, {a.rounds} interleaved round(s); mean epoch time of epochs "
        f"{measured[0] + 1}-{measured[-1] + 1} in s (epoch 1: start-up; epoch {a.epochs}: final val), median "
        "(min-max) over rounds; ratios per round, then median (min-max)",
        "",
        "| side | epoch s | compared with (same round) | epoch 1 s (start-up) | epoch 1 - reference's |",
        "| --- | --- | --- | --- | --- |",
    ]
    first = {side: [run[0] for run in runs] for side, runs in results.items()}
    for side, runs in mean.items():
        refs = [ref for ref in REFERENCES.get(side, ()) if ref in mean]
        ratios = [f"{spread([x / y for x, y in zip(runs, mean[ref])], '{:.3f}')} x {label(a, ref)}" for ref in refs]
        extra = (
            f"{spread([x - y for x, y in zip(first[side], first[refs[0]])], '{:+.2f}')} s vs {label(a, refs[0])}"
            if refs
            else "-"
        )
        lines.append(
            f"| {describe(a, side)} | {spread(runs)} | {'; '.join(ratios) or '-'} | {spread(first[side])} | {extra} |"
        )
    lines += ["", "A ratio below 1 means the side is faster than the one it is compared with."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        default=list(SIDES),
        help="what to run each round (default: all); plain-W and fast/safe use --workers",
    )
    p.add_argument("--workers", type=int, default=2, help="W: workers of plain-W, fast and safe (default: 2)")
    p.add_argument("--threads", type=int, help="threads= of the threads profile (default: the profile's)")
    p.add_argument("--device", default="cpu", help="device of every run, e.g. cpu or 0 (default: cpu)")
    p.add_argument(
        "--data",
        choices=("synthetic", "photos"),
        default="synthetic",
        help="synthetic: the demo's coloured shapes; photos: real-photo 640x480 JPEGs (default: synthetic)",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every side (default: 3)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per run, >= 3 (default: 4)")
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--train", type=int, default=64, help="train images in the generated data set (default: 64)")
    p.add_argument("--val", type=int, default=16, help="val images (default: 16)")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before one run is killed (default: 900)")
    a = p.parse_args(argv)
    stop_on_signals()
    if a.epochs < 3:
        p.error("--epochs must be >= 3 (epoch 1 and the last epoch are not measured)")
    if a.rounds < 1 or a.workers < 1 or (a.threads is not None and a.threads < 1):
        p.error("--rounds, --workers and --threads must be >= 1")

    try:
        with work_dir(a.dir, "bench-train-") as root:
            if a.data == "photos":
                from _photos import write_photo_set

                data = write_photo_set(root / "photos", train=a.train, val=a.val)
            else:
                from rocm_yolo.request.demo import write_demo

                data = write_demo(root / "data", train=a.train, val=a.val, size=max(a.imgsz, 64))
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            sides = [s for s in SIDES if s in a.sides]
            results: dict = {side: [] for side in sides}
            started = time.monotonic()
            for rnd in range(1, a.rounds + 1):
                for side in sides:
                    results[side].append(one_run(a, side, rnd, data, root))
            print(f"\ntotal {time.monotonic() - started:.0f} s\n")
            print("\n".join(report(a, results)))
            return 0
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
