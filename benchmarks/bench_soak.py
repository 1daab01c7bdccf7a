"""A soak of real faults: one run, N random faults from outside, at any moment, start-up included; what each costs.

Trains the demo set for ``--epochs`` epochs twice: once untouched, then with ``--faults`` random real faults,
each a signal (SIGKILL, SIGSEGV or SIGSTOP) into a random one of the trainer, its fork server or a DataLoader
worker, sent while the run trains (the heartbeat shows batches going on) or, for a share ``--startup-share`` of
them, while an attempt starts up (its trainer imports torch, checks the data, builds the loaders: no trained batch
yet), into the trainer or its fork server; the next one once a later attempt has started (or after ``--gap``
seconds if the run shrugged it off: a stopped fork server nobody asks for a worker).
Both runs use ``--stall-timeout`` and ``--checkpoint-every`` (the issue's: 15 s, every 4 batches) and many
restarts. It checks that the faulted run finishes with every epoch once (results.csv) and nothing left running,
and reports the time each fault cost: (faulted - untouched) / faults, and how each was diagnosed and recovered.

Not a test: run it by hand and put its table in docs/watchdog.md.

    python benchmarks/bench_soak.py                        # 10 faults in 12 epochs: about 8 minutes on 2 cores
    python benchmarks/bench_soak.py --faults 3 --epochs 4  # a short one
    python benchmarks/bench_soak.py --faults 4 --epochs 4 --startup-share 1  # every fault during a start-up
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TAG_VAR, interrupted, machine_line, stop_on_signals, work_dir  # noqa: E402

SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGSTOP)
TARGETS = ("trainer", "fork server", "worker")


def command(a, data: Path, name: str) -> list[str]:
    return [
        sys.executable, "-m", "rocm_yolo", "train", str(data), "--name", name, "--epochs", str(a.epochs),
        "--model", "yolo26n.yaml", "--device", "cpu", "--imgsz", "32", "--batch", "4", "--workers", "2",
        "--stall-timeout", str(a.stall_timeout), "--checkpoint-every", a.checkpoint_every,
        "--max-restarts", str(4 * a.faults + 3), "prefetch_factor=1", "plots=False",
    ]  # fmt: skip


def processes(run: Path) -> dict[str, list[psutil.Process]]:
    """The live trainer, fork server and workers of the run's current attempt."""
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.run.supervisor_state import read_state

    state = read_state(RunPaths(run))
    if state is None or state.child_pid is None:
        return {}
    try:
        trainer = psutil.Process(state.child_pid)
        below = trainer.children(recursive=True)
    except psutil.Error:
        return {}
    servers = [p for p in below if "forkserver" in " ".join(_cmdline(p))]
    server_pids = {p.pid for p in servers}
    workers = [p for p in below if _ppid(p) in server_pids]
    return {"trainer": [trainer], "fork server": servers, "worker": workers}


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def training(run: Path, since_seq: int = -1) -> tuple[bool, int, int]:
    """(trains now, the heartbeat's seq, its attempt): batches going on in epoch >= 1, in the current attempt (the
    heartbeat file of an attempt that failed stays until the next one writes its own)."""
    from rocm_yolo.run import heartbeat
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.run.supervisor_state import read_state

    hb, state = heartbeat.read(RunPaths(run).heartbeat), read_state(RunPaths(run))
    if hb is None or state is None or hb.attempt != state.attempt:
        return False, -1, 0
    return hb.phase == "train" and hb.batches_total > 0 and hb.seq > since_seq, hb.seq, hb.attempt


def starting(run: Path) -> int | None:
    """The attempt that is starting up now (its trainer runs, and has trained no batch yet), or None."""
    from rocm_yolo.run import heartbeat
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.run.supervisor_state import read_state

    state = read_state(RunPaths(run))
    if state is None or state.child_pid is None or not psutil.pid_exists(state.child_pid):
        return None
    hb = heartbeat.read(RunPaths(run).heartbeat)
    fresh = hb is None or hb.attempt < state.attempt or hb.batches_total == 0
    return state.attempt if fresh else None


def later_attempt(run: Path, attempt: int) -> bool:
    """Whether an attempt after ``attempt`` has started its trainer."""
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.run.supervisor_state import read_state

    state = read_state(RunPaths(run))
    return state is not None and state.attempt > attempt and state.child_pid is not None


def soak(a, data: Path, root: Path, rng: random.Random) -> dict:
    from rocm_yolo.process.tagged import Tagged

    run = root / "runs" / "detect" / "soak"
    tagged = Tagged(TAG_VAR)
    log = root / "soak.log"
    sent: list[dict] = []
    plan = ["start-up" if rng.random() < a.startup_share else "training" for _ in range(a.faults)]
    began = time.monotonic()
    with open(log, "w") as out:
        proc = tagged.start(command(a, data, "soak"), cwd=root, output=out)
    try:
        while proc.poll() is None and len(sent) < a.faults:
            when = plan[len(sent)]
            if when == "start-up":
                attempt = starting(run)
                found = processes(run) if attempt is not None else {}
                choices = [(kind, p) for kind in TARGETS[:2] for p in found.get(kind, [])]
            else:
                trains, _, attempt = training(run)
                found = processes(run) if trains else {}
                choices = [(kind, p) for kind in TARGETS for p in found.get(kind, [])]
            if not choices:
                time.sleep(0.1)
                continue
            time.sleep(rng.uniform(0, 1.5))  # somewhere inside a batch, or a step of the start-up
            kind, target = rng.choice(choices)
            sig = rng.choice(SIGNALS)
            try:
                target.send_signal(sig)
            except psutil.Error:
                continue
            at = round(time.monotonic() - began, 1)
            sent.append({"at": at, "when": when, "target": kind, "signal": sig.name, "attempt": attempt})
            said = f"  fault {len(sent)}: {sig.name} -> {kind} (pid {target.pid}, attempt {attempt}, {when})"
            print(said, flush=True)
            deadline = time.monotonic() + a.gap  # until a later attempt starts (or the run shrugged it off)
            while proc.poll() is None and time.monotonic() < deadline and not later_attempt(run, attempt):
                time.sleep(0.1)
        code = proc.wait(timeout=a.timeout)
    finally:
        tagged.stop(proc)
    seconds = time.monotonic() - began
    left = tagged.leftovers(2.0)
    return {"code": code, "seconds": seconds, "sent": sent, "run": run, "left": [p.pid for p in left], "log": log}


def untouched(a, data: Path, root: Path) -> float:
    from rocm_yolo.process.tagged import Tagged

    tagged = Tagged(TAG_VAR)
    began = time.monotonic()
    with open(root / "clean.log", "w") as out:
        proc = tagged.start(command(a, data, "clean"), cwd=root, output=out)
    try:
        code = proc.wait(timeout=a.timeout)
    finally:
        tagged.stop(proc)
    if code != 0:
        raise SystemExit(f"the untouched run failed ({code}): {root / 'clean.log'}")
    return time.monotonic() - began


def report(a, clean: float, result: dict) -> list[str]:
    from rocm_yolo.run.events import read_events
    from rocm_yolo.run.paths import RunPaths

    run = result["run"]
    with open(run / "results.csv") as f:
        epochs = [int(float(line.split(",")[0])) for line in f.read().splitlines()[1:]]
    events = read_events(RunPaths(run).events)
    failures = [e for e in events if e["event"] in ("hang", "crash")]
    n = len(result["sent"])
    per = (result["seconds"] - clean) / n if n else 0.0
    lines = [
        f"{machine_line()}",
        f"command: {' '.join(command(a, Path('DATA'), 'NAME')[1:])}",
        "",
        "| run | seconds | faults | exit | epochs once | left running | per fault |",
        "|---|---|---|---|---|---|---|",
        f"| untouched | {clean:.0f} | 0 | 0 | yes | - | - |",
        f"| faulted | {result['seconds']:.0f} | {n} | {result['code']} | "
        f"{'yes' if epochs == list(range(1, a.epochs + 1)) else f'NO: {epochs}'} | {len(result['left'])} | "
        f"{per:.1f} s |",
        "",
        "| # | sent at (s) | during | signal | into | attempt |",
        "|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(result["sent"], 1):
        lines.append(f"| {i} | {f['at']} | {f['when']} | {f['signal']} | {f['target']} | {f['attempt']} |")
    lines += ["", "failures the watchdog saw (attempt: kind, class, title):"]
    lines += [f"- {e.get('attempt')}: {e['event']}, {e.get('class')}, {e.get('message', '')[:140]}" for e in failures]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=10)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--train", type=int, default=32, help="training images (4 a batch)")
    p.add_argument("--stall-timeout", type=float, default=15)
    p.add_argument("--checkpoint-every", default="4ba")
    p.add_argument("--gap", type=float, default=40, help="seconds to wait for a restart before the next fault")
    p.add_argument("--startup-share", type=float, default=0.3, help="the share of faults sent during a start-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--dir", type=Path, help="keep the runs here")
    a = p.parse_args(argv)
    stop_on_signals()
    try:
        with work_dir(a.dir, "soak-") as root:
            from rocm_yolo.request.demo import write_demo

            data = write_demo(root / "data", train=a.train, val=8, size=64)
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            clean = untouched(a, data, root)
            print(f"untouched: {clean:.1f} s", flush=True)
            result = soak(a, data, root, random.Random(a.seed))
            print("\n" + "\n".join(report(a, clean, result)))
            record = {**result, "run": str(result["run"]), "log": str(result["log"]), "untouched": clean}
            (root / "soak.json").write_text(json.dumps(record))
            ok = result["code"] == 0 and not result["left"]
            return 0 if ok else 1
    except KeyboardInterrupt:
        return interrupted()
    except subprocess.TimeoutExpired:
        print("the faulted run did not finish in --timeout", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
