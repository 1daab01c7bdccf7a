"""Time and peak memory of each Conv2d strategy on a YOLO model: a training step and a validation pass.

Each (strategy, phase) runs in a fresh subprocess, so its peak resident set (the kernel's
high-water mark, ``ru_maxrss``) is its own: tracemalloc does not see torch's allocations.

- ``train``: forward + backward of the model in train mode at ``--batch``, in float32
  (``--amp`` runs it under autocast, as Ultralytics' AMP does);
- ``val``: what Ultralytics' validation runs: the model fused (Conv+BN), in eval mode under
  ``torch.inference_mode()``, at twice the batch (the validation loader's batch), on a
  letterboxed 4:3 ("rect") image, in half precision on a GPU (the final validation after
  AMP training; ``--val-fp32`` for float32) and in float32 on the CPU (Ultralytics never
  validates in half there).

Reported: seconds per step or pass (median of ``--iters`` after one warm-up), the peak RSS
growth above the process's RSS just before the first step (on a GPU: torch's peak
allocation), and both as ratios to ``native``. Not a test: run it by hand and copy the
tables into the docs.

    python benchmarks/bench_conv.py                      # yolo26n.yaml, imgsz 320, batch 8, CPU
    python benchmarks/bench_conv.py --threads 1          # the same on a busy shared machine
    python benchmarks/bench_conv.py --device cuda --imgsz 640 --batch 32 --iters 10
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from rocm_yolo.conv.strategies import STRATEGIES

PHASES = ("train", "val")


def worker(args) -> dict:
    import copy
    import resource

    import psutil
    import torch
    from ultralytics import YOLO

    from rocm_yolo.conv.patch import install

    install(args.worker)
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    torch.manual_seed(0)
    model = YOLO(args.model).model.to(args.device)

    def flat(out):
        if isinstance(out, torch.Tensor):
            return [out]
        items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else []
        return [t for v in items for t in flat(v)]

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if args.phase == "train":
        model.train()
        x = torch.randn(args.batch, 3, args.imgsz, args.imgsz, device=args.device)

        def step():
            model.zero_grad(set_to_none=True)
            with torch.autocast(torch.device(args.device).type, enabled=args.amp):
                loss = sum(o.float().square().mean() for o in flat(model(x)))
            loss.backward()
            sync()
    else:
        half = cuda and not args.val_fp32
        fused = copy.deepcopy(model).eval().fuse(verbose=False)
        fused = fused.half() if half else fused.float()
        width = (args.imgsz * 3 // 4 + 31) // 32 * 32  # a 4:3 image letterboxed to a stride-32 multiple
        x = torch.rand(2 * args.batch, 3, args.imgsz, width, device=args.device)
        x = x.half() if half else x

        def step():
            with torch.inference_mode():
                fused(x)
            sync()

    base_rss = psutil.Process().memory_info().rss
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step()  # warm-up (allocator, MIOpen/oneDNN kernel selection)
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss - base_rss
    return {"strategy": args.worker, "phase": args.phase, "seconds": statistics.median(times), "peak_mb": peak / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolo26n.yaml")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8, help="training batch (validation runs twice as many)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", action="store_true", help="train under autocast")
    parser.add_argument("--val-fp32", action="store_true", help="validate in float32 on a GPU too")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's; 1 on a busy shared machine, where waiting OpenMP threads spin)",
    )
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    rows: dict = {}
    for phase in args.phases.split(","):
        for strategy in args.strategies.split(","):
            cmd = (
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    strategy,
                    "--phase",
                    phase,
                    "--model",
                    args.model,
                    "--imgsz",
                    str(args.imgsz),
                    "--batch",
                    str(args.batch),
                    "--iters",
                    str(args.iters),
                    "--device",
                    args.device,
                ]
                + (["--amp"] if args.amp else [])
                + (["--val-fp32"] if args.val_fp32 else [])
            )
            cmd += ["--threads", str(args.threads)] if args.threads else []
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{strategy} {phase}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            rows[strategy, phase] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{strategy} {phase}: {rows[strategy, phase]}", file=sys.stderr)
    if not rows:
        return 1
    import torch

    cuda = args.device.startswith("cuda")
    memory = "peak allocated (MiB)" if cuda else "peak RSS growth (MiB)"
    val_dtype = "fp16" if cuda and not args.val_fp32 else "fp32"
    print(
        f"\n{args.model}, imgsz {args.imgsz}, device {args.device}, median of {args.iters} after a warm-up; "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{args.threads or torch.get_num_threads()} threads"
    )
    print(
        f"train: batch {args.batch}, forward + backward{' under autocast' if args.amp else ''}; "
        f"val: batch {2 * args.batch}, fused, {val_dtype}, inference mode, "
        f"{args.imgsz}x{(args.imgsz * 3 // 4 + 31) // 32 * 32}\n"
    )
    print(
        f"| strategy | train step (s) | vs native | val pass (s) | vs native | train {memory} | vs native "
        f"| val {memory} | vs native |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(strategy, phase, key, fmt):
        r, base = rows.get((strategy, phase)), rows.get(("native", phase))
        if r is None:
            return "failed | -"
        ratio = f"{r[key] / base[key]:.2f}x" if base and base[key] > 0 else "-"
        return f"{format(r[key], fmt)} | {ratio}"

    for strategy in args.strategies.split(","):
        print(
            f"| {strategy} | {cell(strategy, 'train', 'seconds', '.2f')} | {cell(strategy, 'val', 'seconds', '.2f')} "
            f"| {cell(strategy, 'train', 'peak_mb', '.0f')} | {cell(strategy, 'val', 'peak_mb', '.0f')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
