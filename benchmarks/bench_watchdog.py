"""What the watchdog costs and how fast it recovers.

(a) Recovery latency: real CPU training with 2 spawn workers, one of which blocks forever at
    epoch 2 batch 1 (``ROCM_YOLO_FAULT=worker-hang@2:1``). Measured from the run's records:
    hang = mtime of ``rocm_yolo/fault.fired``; detection = the ``hang`` event; restart = the
    ``restart`` event (after the stack dump and the kill of the tree); first batch after the
    restart = the first ``workers`` event after it (written at the first batch of an epoch).
    Detection is the stall timeout plus the batches the trainer still had prefetched.
(b) Heartbeat cost per batch: ``HeartbeatWriter.on_train_batch_end`` on a fake trainer, with the
    real atomic write into a temporary directory (at most one write a second), plus the cost
    of one write, set against the batch time of a real tiny training (the heartbeat's ``it_s``).

Not a test: run it by hand on a quiet machine and paste the table into the docs.

    python benchmarks/bench_watchdog.py                          # stall timeouts 10 and 30 s, ~2 min on 2 cores
    python benchmarks/bench_watchdog.py --stall-timeouts 10 --rounds 3
    python benchmarks/bench_watchdog.py --skip-hang              # (b) only, plus one tiny training
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interrupted, machine_line, run_logged, stop_on_signals, work_dir  # noqa: E402

TINY = [
    "--model",
    "yolo26n.yaml",
    "--device",
    "cpu",
    "--workers",
    "2",
    "--imgsz",
    "32",
    "--batch",
    "4",
    "prefetch_factor=1",
    "plots=False",
]


def rocm_yolo(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "rocm_yolo", *args]


# (a) recovery latency --------------------------------------------------------------------------
def hang_round(a, data: Path, root: Path, stall: float, rnd: int) -> dict:
    from rocm_yolo.run.events import read_events
    from rocm_yolo.run.paths import RunPaths

    name = f"stall{stall:g}-r{rnd}"
    log = root / f"{name}.log"
    args = [
        "train",
        str(data),
        "--epochs",
        "3",
        *TINY,
        "--stall-timeout",
        f"{stall:g}",
        "--startup-grace",
        "60",
        "--project",
        str(root / "runs"),
        "--name",
        name,
    ]
    t0 = time.monotonic()
    code = run_logged(rocm_yolo(args), root, log, a.timeout, env={"ROCM_YOLO_FAULT": a.fault})
    run = root / "runs" / name
    fired = RunPaths(run).fault_fired(a.fault.partition("@")[0])
    evs = read_events(RunPaths(run).events)
    hang = next((e for e in evs if e["event"] == "hang"), None)  # a crash restart before it would not count
    restart = next((e for e in evs if e["event"] == "restart" and hang and e["time"] >= hang["time"]), None)
    if code != 0 or not fired.exists() or hang is None or restart is None:
        raise SystemExit(
            f"hang run {name}: exit {code}, fault fired {fired.exists()}, events "
            f"{[e['event'] for e in evs]}; log {log}:\n{log.read_text(errors='replace')[-2000:]}"
        )
    # the hang event's time is when its diagnosis is said (after the stack dump and the kill); its notice: "detected"
    hung, detected, restarted = fired.stat().st_mtime, hang.get("detected", hang["time"]), restart["time"]
    batch = next((e["time"] for e in evs if e["event"] == "workers" and e["time"] > restarted), None)
    text = (run / "rocm-yolo.log").read_text(errors="replace") if (run / "rocm-yolo.log").exists() else ""
    timeout = re.search(r"\(timeout (\d+) s\)", text)
    out = {
        "stall": stall,
        "timeout": int(timeout.group(1)) if timeout else None,
        "no_progress": hang.get("seconds"),
        "detect": detected - hung,
        "restart": restarted - detected,
        "first_batch": (batch - restarted) if batch else None,
        "total": (batch - hung) if batch else None,
    }
    print(
        f"  --stall-timeout {stall:g} round {rnd}: {time.monotonic() - t0:.0f} s wall, detection "
        f"{out['detect']:.1f} s after the hang, restart +{out['restart']:.1f} s, first batch +"
        f"{out['first_batch'] or float('nan'):.1f} s",
        flush=True,
    )
    return out


def heartbeat_it_s(run: Path) -> float | None:
    from rocm_yolo.run.heartbeat import read
    from rocm_yolo.run.paths import RunPaths

    hb = read(RunPaths(run).heartbeat)
    return hb.it_s if hb and hb.it_s > 0 else None


# (b) heartbeat cost ---------------------------------------------------------------------------
def heartbeat_cost(calls: int, writes: int) -> dict:
    from rocm_yolo.run.heartbeat import MIN_INTERVAL
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter

    with tempfile.TemporaryDirectory(prefix="bench-hb-") as tmp:
        writer = HeartbeatWriter(Path(tmp) / "heartbeat.json")
        trainer = SimpleNamespace(epoch=0, epochs=1, train_loader=[None] * (calls + 1))
        writer.on_train_epoch_start(trainer)
        writer.on_train_batch_end(trainer)  # the forced write of an epoch's first batch
        t0 = time.perf_counter()
        for _ in range(calls):
            writer.on_train_batch_end(trainer)
        per_call = (time.perf_counter() - t0) / calls
        t0 = time.perf_counter()
        for _ in range(writes):
            writer.write("train", force=True)
        per_write = (time.perf_counter() - t0) / writes
    return {"per_call": per_call, "per_write": per_write, "interval": MIN_INTERVAL, "calls": calls, "writes": writes}


# report ----------------------------------------------------------------------------------------
def med(xs: list, fmt: str = "{:.1f}") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    text = fmt.format(statistics.median(xs))
    return text if len(xs) == 1 else f"{text} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def report(a, hangs: dict, hb: dict, batch_s: float | None) -> list[str]:
    command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
    lines = [f"Command: `{command}`", "", f"Machine: {machine_line()}", ""]
    if hangs:
        lines += [
            f"(a) `ROCM_YOLO_FAULT={a.fault}`, `rocm-yolo train DATA --epochs 3 {' '.join(TINY)} "
            f"--startup-grace 60` (16 train images), {a.rounds} round(s); seconds, median (min-max)",
            "",
            "| --stall-timeout | timeout used | no progress | hang -> detected | detected -> restart "
            "| restart -> first batch | hang -> first batch |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for stall, rows in hangs.items():
            col = lambda k: [r[k] for r in rows]  # noqa: E731
            lines.append(
                f"| {stall:g} | {med(col('timeout'), '{:.0f}')} | {med(col('no_progress'))} | "
                f"{med(col('detect'))} | {med(col('restart'))} | {med(col('first_batch'))} | "
                f"{med(col('total'))} |"
            )
        lines += [
            "",
            "hang -> detected: to the hang event's notice (its detected field); detected -> restart: stack dump of "
            "the tree, its kill and the diagnosis; restart -> first batch: a new training process, resume from "
            "last.pt, fresh workers from the fork server (profile 'safe').",
            "",
        ]
    per_write, per_call = hb["per_write"], hb["per_call"]
    lines += [
        f"(b) heartbeat: {hb['calls']:,} `on_train_batch_end` calls ({per_call * 1e6:.2f} µs each, "
        f"writes rate-limited to 1 per {hb['interval']:g} s), {hb['writes']} forced atomic writes "
        f"({per_write * 1e6:.0f} µs each)",
        "",
    ]
    if batch_s:
        cost = per_call + per_write * min(1.0, batch_s / hb["interval"])  # at most one write a batch
        lines += [
            "| batch time | call | write share | heartbeat cost per batch | share of a batch |",
            "| --- | --- | --- | --- | --- |",
            f"| {batch_s * 1e3:.0f} ms ({a.batch_source}) | {per_call * 1e6:.2f} µs | "
            f"{per_write * min(1.0, batch_s / hb['interval']) * 1e6:.1f} µs | {cost * 1e6:.1f} µs | "
            f"{cost / batch_s:.4%} |",
            "",
            f"heartbeat cost per batch: {cost * 1e6:.1f} µs = {cost / batch_s:.4%} of a {batch_s * 1e3:.0f} ms "
            f"batch (goal: < 0.5%)",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--stall-timeouts",
        type=float,
        nargs="+",
        default=[10.0, 30.0],
        metavar="S",
        help="--stall-timeout values to measure (default: 10 30)",
    )
    p.add_argument("--rounds", type=int, default=1, help="hang runs per stall timeout (default: 1)")
    p.add_argument("--fault", default="worker-hang@2:1", help="ROCM_YOLO_FAULT of the hang runs")
    p.add_argument("--calls", type=int, default=200_000, help="heartbeat calls to time (default: 200000)")
    p.add_argument("--writes", type=int, default=500, help="forced heartbeat writes to time (default: 500)")
    p.add_argument("--batch-ms", type=float, help="batch time to relate the cost to (default: measured)")
    p.add_argument("--skip-hang", action="store_true", help="only (b); the batch time comes from a 2-epoch run")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before one run is killed (default: 600)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.calls < 1 or a.writes < 1 or any(s <= 0 for s in a.stall_timeouts):
        p.error("--rounds, --calls, --writes and --stall-timeouts must be > 0")
    stop_on_signals()

    try:
        with work_dir(a.dir, "bench-watchdog-") as root:
            from rocm_yolo.request.demo import write_demo

            data = write_demo(root / "data", train=16, val=8, size=64)
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            hangs: dict = {}
            if not a.skip_hang:
                for stall in a.stall_timeouts:
                    hangs[stall] = [hang_round(a, data, root, stall, rnd) for rnd in range(1, a.rounds + 1)]
            batch_s, a.batch_source = (a.batch_ms / 1e3 if a.batch_ms else None), "--batch-ms"
            if batch_s is None and hangs:  # the restarted attempt of the last hang run trained to the end
                it_s = heartbeat_it_s(root / "runs" / f"stall{a.stall_timeouts[-1]:g}-r{a.rounds}")
                batch_s, a.batch_source = (1 / it_s if it_s else None), "heartbeat it_s, imgsz 32 batch 4, profile safe"
            if batch_s is None:
                args = ["train", str(data), "--epochs", "2", *TINY, "--project", str(root / "runs"), "--name", "tiny"]
                if run_logged(rocm_yolo(args), root, root / "tiny.log", a.timeout) == 0:
                    it_s = heartbeat_it_s(root / "runs" / "tiny")
                    batch_s, a.batch_source = (
                        (1 / it_s if it_s else None),
                        "heartbeat it_s, imgsz 32 batch 4, profile fast",
                    )
            hb = heartbeat_cost(a.calls, a.writes)
            print()
            print("\n".join(report(a, hangs, hb, batch_s)))
            return 0
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
