"""Time and peak memory of each Conv2d strategy on a YOLO model, forward + backward.

Each strategy runs in a fresh subprocess, so its peak resident set (the kernel's
high-water mark, ``ru_maxrss``) is its own: tracemalloc does not see torch's allocations.
Reported: seconds per training step (forward + backward, median of ``--iters`` after one
warm-up step), the peak RSS growth above the process's RSS just before the first step, and
both as ratios to ``native``. Not a test: run it by hand and copy the table into the docs.

    python benchmarks/bench_conv.py                      # yolo26n.yaml, imgsz 320, batch 8, CPU
    python benchmarks/bench_conv.py --device cuda --iters 10
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

STRATEGIES = ("native", "aten", "fp32", "gemm")


def worker(args) -> dict:
    import resource

    import psutil
    import torch
    from ultralytics import YOLO

    from rocm_yolo.patches.conv import install

    install(args.worker)
    torch.manual_seed(0)
    model = YOLO(args.model).model.to(args.device).train()
    x = torch.randn(args.batch, 3, args.imgsz, args.imgsz, device=args.device)

    def flat(out):
        if isinstance(out, torch.Tensor):
            return [out]
        items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else []
        return [t for v in items for t in flat(v)]

    def step():
        model.zero_grad(set_to_none=True)
        sum(o.float().square().mean() for o in flat(model(x))).backward()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    base_rss = psutil.Process().memory_info().rss
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    step()  # warm-up (allocator, MIOpen/oneDNN kernel selection)
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    result = {"strategy": args.worker, "step_s": statistics.median(times), "peak_mb": (peak_rss - base_rss) / 2**20}
    if args.device.startswith("cuda"):
        result["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolo26n.yaml")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    rows = []
    for strategy in args.strategies.split(","):
        cmd = [sys.executable, __file__, "--worker", strategy, "--model", args.model, "--imgsz", str(args.imgsz),
               "--batch", str(args.batch), "--iters", str(args.iters), "--device", args.device]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{strategy}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{strategy}: {rows[-1]}", file=sys.stderr)
    native = next((r for r in rows if r["strategy"] == "native"), rows[0] if rows else None)
    if native is None:
        return 1
    import torch

    memory = "peak allocated (MiB)" if args.device.startswith("cuda") else "peak RSS growth (MiB)"
    print(f"\n{args.model}, imgsz {args.imgsz}, batch {args.batch}, device {args.device}, "
          f"median of {args.iters} steps; torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads\n")
    print(f"| strategy | step (s) | time vs native | {memory} | memory vs native |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['strategy']} | {r['step_s']:.2f} | {r['step_s'] / native['step_s']:.2f}x "
              f"| {r['peak_mb']:.0f} | {r['peak_mb'] / native['peak_mb']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
