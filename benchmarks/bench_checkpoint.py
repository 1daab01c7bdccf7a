"""What mid-epoch checkpoints cost, and how much work they save when a run hangs.

(a) Cost in training: the same real CPU training (``--profile single``, yolo26n from YAML,
    generated data) with ``--checkpoint-every 0`` and with frequent checkpoints, interleaved
    for ``--rounds`` rounds, each run in a fresh process. Epoch times come from the cumulative
    ``time`` column of ``results.csv`` (epoch 1, start-up, and the last epoch, final
    validation, left out); the extra time per checkpoint is (epoch time with - without) /
    checkpoints per epoch, which includes everything: the copy on the training thread and
    the background serialization competing for the same cores. Divided by the default
    interval (600 s) it is the cost at ``--checkpoint-every 10m``. The ``mid_checkpoint``
    events give each checkpoint's size, training-thread stall and background write time.
(b) Stall by model size: :class:`rocm_yolo.trainer.midepoch.save.MidEpochSave`'s own snapshot (the
    only part on the training thread) and the background write (``torch.save`` into an
    atomic, fsynced file) for yolo26n/s/m/l/x with an AdamW state, without training.
(c) Work lost per hang: ``ROCM_YOLO_FAULT=worker-hang@2:B`` late in epoch 2 of a real run
    with 1 spawn worker, restarted by the watchdog (``--fallback fast,single``), with
    ``--checkpoint-every 0`` and with mid-epoch checkpoints; ``supervisor.json`` gives the
    batches trained again and the seconds lost (detection + restart + retraining).

Not a test: run it by hand on a quiet machine and paste the tables into the docs. These are CPU
figures: on a GPU the copy to host memory is a device transfer and the background write does
not compete with the training's compute.

    python benchmarks/bench_checkpoint.py                       # (a) 3 rounds, (b), (c): about 15 min on 2 cores
    python benchmarks/bench_checkpoint.py --skip-cost --skip-hang --models n s m l x
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interrupted, machine_line, run_logged, size_args, stop_on_signals, work_dir  # noqa: E402

BASE = ["--model", "yolo26n.yaml", "--device", "cpu", "plots=False", "val=False", "--profile", "single"]


def rocm_yolo(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "rocm_yolo", *args]


def med(xs, fmt="{:.2f}") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    text = fmt.format(statistics.median(xs))
    return text if len(xs) == 1 else f"{text} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def epoch_times(run: Path) -> list[float]:
    with open(run / "results.csv") as f:
        cumulative = [float(row["time"]) for row in csv.DictReader(f)]
    per_epoch = [b - a for a, b in zip([0.0] + cumulative, cumulative)]
    return per_epoch[1:-1]  # without start-up and the final validation


# (a) cost in training -------------------------------------------------------------------------
def cost_round(a, data: Path, root: Path, interval: str, rnd: int) -> dict:
    from rocm_yolo.run.events import read_events
    from rocm_yolo.run.paths import RunPaths

    name = f"every-{interval}-r{rnd}"
    args = [
        "train",
        str(data),
        *BASE,
        *size_args(a),
        "--checkpoint-every",
        interval,
        "--project",
        str(root / "runs"),
        "--name",
        name,
    ]
    code = run_logged(rocm_yolo(args), root, root / f"{name}.log", a.timeout)
    run = root / "runs" / name
    if code != 0:
        raise SystemExit(f"run {name} exited {code}; log {root / f'{name}.log'}")
    ckpts = [e for e in read_events(RunPaths(run).events) if e["event"] == "mid_checkpoint"]
    measured = [e for e in ckpts if 1 < e["epoch"] < a.epochs]
    out = {
        "epoch": statistics.mean(epoch_times(run)),
        "per_epoch": len(measured) / max(a.epochs - 2, 1),
        "stall": [e["stall_seconds"] for e in ckpts],
        "write": [e["write_seconds"] for e in ckpts],
        "mb": [e["bytes"] / 2**20 for e in ckpts],
    }
    print(
        f"  {interval:>5} round {rnd}: epoch {out['epoch']:.2f} s, {out['per_epoch']:.1f} checkpoints/epoch", flush=True
    )
    return out


def cost_table(a, rows: dict) -> list[str]:
    lines = [
        f"(a) `rocm-yolo train DATA {' '.join(BASE)} --epochs {a.epochs} --imgsz {a.imgsz} --batch {a.batch}` "
        f"({a.train} images, {a.train // a.batch} batches/epoch), interleaved, {a.rounds} round(s); "
        "median (min-max) over rounds",
        "",
        "| --checkpoint-every | epoch (s) | vs 0 | checkpoints/epoch | extra time per checkpoint (s) "
        "| size (MB) | training-thread stall (s) | background write (s) | cost at 10m |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = [r["epoch"] for r in rows["0"]]
    for interval, runs in rows.items():
        ratio = [r["epoch"] / b for r, b in zip(runs, base)]
        extra = [(r["epoch"] - b) / r["per_epoch"] for r, b in zip(runs, base) if r["per_epoch"]]
        stall = [s for r in runs for s in r["stall"]]
        write = [w for r in runs for w in r["write"]]
        mb = [m for r in runs for m in r["mb"]]
        at_default = [max(x, 0.0) / 600 for x in extra]
        lines.append(
            f"| {interval} | {med([r['epoch'] for r in runs])} | {med(ratio, '{:.3f}')} | "
            f"{med([r['per_epoch'] for r in runs], '{:.1f}')} | {med(extra) if extra else '-'} | "
            f"{med(mb, '{:.0f}')} | {med(stall, '{:.3f}')} | {med(write)} | "
            f"{med(at_default, '{:.3%}') if extra else '-'} |"
        )
    return lines + [""]


# (b) stall by model size ----------------------------------------------------------------------
def fake_trainer(model_yaml: str, n: int = 64):
    """What MidEpochSave._snapshot reads from a trainer, with a real model, EMA and AdamW state."""
    import torch
    from ultralytics import YOLO
    from ultralytics.utils.torch_utils import ModelEMA

    model = YOLO(model_yaml).model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # pending accumulated gradients: the largest checkpoint
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    stopper = SimpleNamespace(best_fitness=0.1, best_epoch=1, patience=100, possible_stop=False)
    return SimpleNamespace(
        model=model,
        ema=ModelEMA(model),
        optimizer=optimizer,
        scaler=scaler,
        epoch=1,
        epochs=3,
        tloss={"box": torch.tensor(1.0)},
        stopper=stopper,
        train_loader=_Loader(n),
        args=SimpleNamespace(imgsz=640),
        metrics={},
        fitness=None,
        best_fitness=None,
    )


class _Loader:
    """The parts of Ultralytics' train loader the snapshot reads."""

    num_workers = 0

    def __init__(self, n: int):
        self.dataset = [0] * n
        self.batch_sampler = SimpleNamespace(sampler=SimpleNamespace(batch_size=2))

    def __len__(self) -> int:
        return len(self.dataset) // 2


def stall_row(model_yaml: str, root: Path, repeats: int) -> dict:
    import torch

    from rocm_yolo.process.output import RunLog
    from rocm_yolo.run.atomic import write_atomic
    from rocm_yolo.run.midepoch_state import parse_interval
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.trainer.midepoch.capture import TrainOrder
    from rocm_yolo.trainer.midepoch.sample_order import PassSampler
    from rocm_yolo.trainer.midepoch.save import MidEpochSave

    trainer = fake_trainer(model_yaml)
    log = RunLog()
    mid = MidEpochSave(RunPaths(root), log, parse_interval("10m"), TrainOrder(log))
    mid.order.sampler = PassSampler(SimpleNamespace(generator=torch.Generator(), __len__=lambda: 64))
    mid.order.sampler.states[0], mid.pass_number = torch.Generator().get_state(), 0
    loop = {"i": 9, "ni": 41, "last_opt_step": 40}
    snaps, writes, size = [], [], 0
    for _ in range(repeats + 1):  # the first allocates the host buffers: not counted
        t0 = time.perf_counter()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as MidEpochSave._save does
        try:
            ckpt = mid._snapshot(trainer, loop, 10)
        finally:
            torch.set_num_threads(threads)
        snaps.append(time.perf_counter() - t0)
        path = root / "ep2-ba10.pt"
        t0 = time.perf_counter()
        write_atomic(path, lambda f: torch.save(ckpt, f), durable=True)
        writes.append(time.perf_counter() - t0)
        size = path.stat().st_size
        path.unlink()
    params = sum(p.numel() for p in trainer.model.parameters())
    return {
        "model": Path(model_yaml).stem,
        "params": params,
        "mb": size / 2**20,
        "first": snaps[0],
        "stall": statistics.median(snaps[1:]),
        "write": statistics.median(writes),
    }


def per_batch_cost(calls: int) -> float:
    """Seconds per batch of the callbacks when no checkpoint is due (the interval check)."""
    from rocm_yolo.process.output import RunLog
    from rocm_yolo.run.midepoch_state import parse_interval
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.trainer.midepoch.capture import TrainOrder
    from rocm_yolo.trainer.midepoch.save import MidEpochSave

    with tempfile.TemporaryDirectory(prefix="bench-mid-") as tmp:
        log = RunLog()
        mid = MidEpochSave(RunPaths(tmp), log, parse_interval("10m"), TrainOrder(log))
        trainer = SimpleNamespace(train_loader=_Loader(10 * calls), stop=False)
        mid.on_train_start(trainer)
        t0 = time.perf_counter()
        for _ in range(calls):
            mid.on_train_batch_start(trainer)
            mid.on_train_batch_end(trainer)
        return (time.perf_counter() - t0) / calls


def stall_table(rows: list[dict], repeats: int) -> list[str]:
    lines = [
        f"(b) the snapshot on the training thread and the background write, without training "
        f"(AdamW state and pending gradients), median of {repeats}",
        "",
        "| model | parameters | checkpoint (MB) | training-thread stall (s): first / later "
        "| background write + fsync (s) | stall at 10m |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['mb']:.0f} | {r['first']:.3f} / {r['stall']:.3f} "
            f"| {r['write']:.2f} | {r['stall'] / 600:.4%} |"
        )
    return lines + [""]


# (c) work lost per hang -----------------------------------------------------------------------
def hang_round(a, data: Path, root: Path, interval: str, rnd: int) -> dict:
    name = f"hang-{interval}-r{rnd}"
    args = [
        "train",
        str(data),
        "--model",
        "yolo26n.yaml",
        "--device",
        "cpu",
        "plots=False",
        "val=False",
        "--epochs",
        "2",
        "--imgsz",
        "32",
        "--batch",
        "2",
        "--workers",
        "1",
        "prefetch_factor=1",
        "--checkpoint-every",
        interval,
        "--stall-timeout",
        str(a.stall),
        "--startup-grace",
        "120",
        "--fallback",
        "fast,single",
        "--project",
        str(root / "runs"),
        "--name",
        name,
    ]
    code = run_logged(
        rocm_yolo(args), root, root / f"{name}.log", a.timeout, env={"ROCM_YOLO_FAULT": f"worker-hang@2:{a.hang_batch}"}
    )
    state = json.loads((root / "runs" / name / "rocm_yolo" / "supervisor.json").read_text())
    if code != 0 or not state.get("recoveries"):
        raise SystemExit(f"hang run {name}: exit {code}; log {root / f'{name}.log'}")
    r = state["recoveries"][0]
    out = {
        "retrained": r["retrained_batches"],
        "detect": r["detect_seconds"],
        "restart": r["restart_seconds"],
        "retrain": r["retrain_seconds"],
        "lost": state["lost_seconds"],
        "from": r["checkpoint"],
    }
    print(
        f"  --checkpoint-every {interval} round {rnd}: resumed from {out['from']}, {out['retrained']} batches "
        f"again, {out['lost']:.0f} s lost",
        flush=True,
    )
    return out


def hang_table(a, rows: dict) -> list[str]:
    lines = [
        f"(c) `ROCM_YOLO_FAULT=worker-hang@2:{a.hang_batch}` ({a.hang_train // 2} batches/epoch, imgsz 32, "
        f"batch 2, 1 spawn worker, --stall-timeout {a.stall:g}, restart on 'single'); seconds, median (min-max)",
        "",
        "| --checkpoint-every | resumed from | batches trained again | detect | restart | retrain | lost to the hang |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for interval, runs in rows.items():
        col = lambda k: [r[k] for r in runs]  # noqa: E731
        lines.append(
            f"| {interval} | {', '.join(sorted(set(col('from'))))} | {med(col('retrained'), '{:.0f}')} | "
            f"{med(col('detect'), '{:.1f}')} | {med(col('restart'), '{:.1f}')} | "
            f"{med(col('retrain'), '{:.1f}')} | {med(col('lost'), '{:.1f}')} |"
        )
    return lines + [
        "",
        "Batches trained again are counted from the last heartbeat before the hang (at most a second "
        "old); the retraining time is measured until the new attempt is back at that batch.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--intervals", nargs="+", default=["4ba", "16ba"], help="(a) intervals besides 0 (default: 4ba 16ba)"
    )
    p.add_argument("--rounds", type=int, default=3, help="(a) interleaved rounds (default: 3)")
    p.add_argument("--epochs", type=int, default=4, help="(a) epochs per run (default: 4: epochs 2-3 are measured)")
    p.add_argument("--train", type=int, default=128, help="(a) training images (default: 128)")
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--models", nargs="+", default=["n", "s", "m"], help="(b) yolo26 sizes (default: n s m)")
    p.add_argument("--repeats", type=int, default=3, help="(b) snapshots per model (default: 3)")
    p.add_argument("--hang-intervals", nargs="+", default=["0", "10ba"], help="(c) default: 0 10ba")
    p.add_argument("--hang-rounds", type=int, default=1)
    p.add_argument("--hang-train", type=int, default=64, help="(c) training images (default: 64: 32 batches/epoch)")
    p.add_argument("--hang-batch", type=int, default=28, help="(c) the worker hangs after this batch of epoch 2")
    p.add_argument("--stall", type=float, default=10, help="(c) --stall-timeout (default: 10)")
    p.add_argument("--skip-cost", action="store_true")
    p.add_argument("--skip-stall", action="store_true")
    p.add_argument("--skip-hang", action="store_true")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=900, help="seconds before one run is killed (default: 900)")
    a = p.parse_args(argv)
    stop_on_signals()
    try:
        with work_dir(a.dir, "bench-checkpoint-") as root:
            from rocm_yolo.request.demo import write_demo

            print(f"work directory: {root}\n{machine_line()}", flush=True)
            command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
            out = [f"Command: `{command}`", "", f"Machine: {machine_line()} (CPU only)", ""]
            if not a.skip_cost:
                data = write_demo(root / "data", train=a.train, val=8, size=64)
                rows: dict = {i: [] for i in ["0", *a.intervals]}
                for rnd in range(1, a.rounds + 1):
                    for interval in rows:
                        rows[interval].append(cost_round(a, data, root, interval, rnd))
                out += cost_table(a, rows)
            if not a.skip_stall:
                with tempfile.TemporaryDirectory(prefix="stall-", dir=root) as tmp:
                    found = []
                    for size in a.models:
                        found.append(stall_row(f"yolo26{size}.yaml", Path(tmp), a.repeats))
                        print(
                            f"  yolo26{size}: stall {found[-1]['stall']:.3f} s, write {found[-1]['write']:.2f} s",
                            flush=True,
                        )
                out += stall_table(found, a.repeats)
                per_batch = per_batch_cost(200_000)
                out += [
                    f"Per batch when no checkpoint is due (`on_train_batch_start` + `on_train_batch_end`, "
                    f"200,000 calls): {per_batch * 1e6:.2f} µs.",
                    "",
                ]
            if not a.skip_hang:
                data = write_demo(root / "hang-data", train=a.hang_train, val=4, size=64)
                hangs = {
                    i: [hang_round(a, data, root, i, rnd) for rnd in range(1, a.hang_rounds + 1)]
                    for i in a.hang_intervals
                }
                out += hang_table(a, hangs)
            print()
            print("\n".join(out))
            return 0
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
