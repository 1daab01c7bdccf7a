"""DataLoader start-up: time to the first batch against the worker count, per start method.

Each measurement runs in a fresh process shaped like rocm-yolo's training child: the
default start method is set to spawn before torch is imported; for ``forkserver`` the
preloaded fork server (rocm_yolo.trainer.forkserver.server) is started right then, as the child does;
then torch and Ultralytics are imported and Ultralytics' own training dataset (mosaic and
the other augmentations) and ``build_dataloader`` are built, with rocm-yolo's DataLoader
patch installed. The clock for "first batch" starts at ``iter(loader)``; "from start" is
from the process start, and shows what the set-up before the loader hides.

``fork`` is what plain Ultralytics does (workers forked from the trainer, which has torch
imported); ``spawn`` is rocm-yolo 0.1; ``forkserver`` is rocm-yolo now.

    python benchmarks/bench_loader.py                               # 1/2/4 workers x 3 methods, 3 rounds
    python benchmarks/bench_loader.py --workers 1,2,4,8 --rounds 5 --images 200 --imgsz 640 --real

Images/s of loader threads (the ``threads`` profile) against worker processes and the main
thread: ``bench_threads.py``. Not a test: run it by hand on a quiet machine and paste the
table into the README.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interrupted, machine_line, stop_on_signals, work_dir  # noqa: E402

METHODS = ("fork", "spawn", "forkserver")


def write_data(root: Path, images: int, real: bool) -> Path:
    """A detection set: real photos (``_photos.py``: 640x480 JPEGs, random boxes) with
    ``--real``, else rocm-yolo's synthetic demo shapes."""
    if real:
        from _photos import write_photo_set

        return write_photo_set(root / "photos", train=images, val=8)
    from rocm_yolo.request.demo import write_demo

    return write_demo(root / "synthetic", train=images, val=8, size=640)


CHILD = r"""
import json, sys, time
t0 = time.monotonic()
import multiprocessing
multiprocessing.set_start_method("spawn", force=True)  # as rocm-yolo's training child, before torch
args = json.loads(sys.argv[1])
if args["method"] == "forkserver":
    from rocm_yolo.trainer.forkserver import server as forkserver
    forkserver.start(args["run_dir"])
import torch
from ultralytics.cfg import get_cfg
from ultralytics.data.build import build_dataloader, build_yolo_dataset
from ultralytics.data.utils import check_det_dataset
from rocm_yolo.patches.loaders import dataloader as patch
from rocm_yolo.policy.profiles import resolve
settings = resolve("fast", args["workers"], {"start_method": args["method"]}, cpu_count=64).loader
patch.install(settings, args["run_dir"])
data = check_det_dataset(args["data"])
cfg = get_cfg(overrides={"imgsz": args["imgsz"], "task": "detect"})
dataset = build_yolo_dataset(cfg, data["train"], args["batch"], data, mode="train", stride=32)
loader = build_dataloader(dataset, args["batch"], args["workers"], shuffle=True, rank=-1)
def forever():
    while True:
        yield from loader  # InfiniteDataLoader: one epoch per iter(), the same workers
t1 = time.monotonic()
it = forever()
next(it)
t2 = time.monotonic()
n = 0
for _ in range(args["batches"]):
    n += next(it)["img"].shape[0]
t3 = time.monotonic()
print("RESULT " + json.dumps({"first_batch": t2 - t1, "from_start": t2 - t0, "setup": t1 - t0,
                              "images_s": n / (t3 - t2) if t3 > t2 else None}), flush=True)
loader.close()
"""


def measure(a, data: Path, root: Path, method: str, workers: int) -> dict:
    run_dir = root / f"run-{method}-{workers}"
    args = {
        "method": method,
        "workers": workers,
        "data": str(data),
        "imgsz": a.imgsz,
        "batch": a.batch,
        "batches": a.batches,
        "run_dir": str(run_dir),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, timeout=a.timeout
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{method} x{workers} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts (comma-separated)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="batches after the first, for images/s")
    parser.add_argument("--real", action="store_true", help="real photos (640x480 JPEGs) instead of synthetic shapes")
    parser.add_argument("--keep", type=Path, help="keep the data and runs here")
    parser.add_argument("--timeout", type=float, default=600)
    a = parser.parse_args()
    stop_on_signals()
    counts = [int(x) for x in a.workers.split(",")]
    methods = [m for m in a.methods.split(",") if m]
    print(machine_line())
    try:
        with work_dir(a.keep, "bench-loader-") as root:
            data = write_data(root, a.images, a.real)
            results: dict = {}
            for rnd in range(a.rounds):  # rounds interleave every setting: a slow phase hits all
                for workers in counts:
                    for method in methods:
                        r = measure(a, data, root / f"r{rnd}", method, workers)
                        results.setdefault((method, workers), []).append(r)
                        print(
                            f"  round {rnd + 1}: {method:<10} x{workers}: first batch {r['first_batch']:.2f} s "
                            f"(from start {r['from_start']:.2f} s)",
                            flush=True,
                        )
    except KeyboardInterrupt:
        return interrupted()
    print(
        f"\n{a.images} {'real-photo' if a.real else 'synthetic'} images, imgsz {a.imgsz}, batch {a.batch}; "
        f"median of {a.rounds} rounds; first batch from iter(loader) (from process start)"
    )
    header = "| workers | " + " | ".join(methods) + " |"
    print(header + "\n|" + "---|" * (len(methods) + 1))
    for workers in counts:
        cells = []
        for method in methods:
            rs = results[(method, workers)]
            cells.append(
                f"{statistics.median(r['first_batch'] for r in rs):.2f} s "
                f"({statistics.median(r['from_start'] for r in rs):.1f} s)"
            )
        print(f"| {workers} | " + " | ".join(cells) + " |")
    for method in methods:
        one = statistics.median(r["first_batch"] for r in results[(method, counts[0])])
        most = statistics.median(r["first_batch"] for r in results[(method, counts[-1])])
        print(f"{method}: {counts[-1]} workers / {counts[0]} worker first batch = {most / one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
