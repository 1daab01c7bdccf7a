"""Loading speed of Ultralytics' training loader: loader threads vs worker processes vs the main process.

Each measurement runs in a fresh process (``--one``, JSON in, one JSON line out) on a real-photo
data set (see ``_photos.py``), with Ultralytics' own ``build_yolo_dataset`` + ``build_dataloader``
(augmentations on: mosaic, affine, HSV, flips) at ``--imgsz``, through rocm-yolo's DataLoader
patch with the settings of the profile it stands for:

- ``main``: ``workers=0``, no patch: one ``__getitem__`` after the other in the main thread (what
  ``--profile single`` and plain ``workers=0`` do);
- ``threads N``: ``--profile threads threads=N``: N loader threads inside this process;
- ``processes N``: ``--profile fast --workers N`` (its start method, or ``--start-method``).

Reported per setting: the time to the first batch (thread or worker start-up included), then
images/s over the next ``--batches`` batches while the consumer does nothing else (pure loading:
in training the trainer's own work shares the CPU). First-batch time against the worker count
for each start method: ``bench_loader.py``. Not a test: run it by hand on a quiet machine.

    python benchmarks/bench_threads.py                               # threads 1 2 4 vs processes 1 2 4
    python benchmarks/bench_threads.py --threads 2 4 8 16 --processes 8 --images 1000 --batch 32 --batches 20
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


# one measurement, in a fresh process -------------------------------------------------------------
def measure_loading(spec: dict) -> dict:
    """Time to the first batch and images/s after it, for one loader setting (runs in this process)."""
    from rocm_yolo.patches.loaders import dataloader as patch
    from rocm_yolo.policy.profiles import resolve

    kind, n = spec["kind"], spec["n"]
    if kind == "threads":
        patch.install(resolve("threads", None, {"threads": n}).loader)
    elif kind == "processes":
        overrides = {"start_method": spec["start_method"]} if spec.get("start_method") else {}
        patch.install(resolve("fast", n, overrides).loader)
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils.torch_utils import init_seeds

    init_seeds(0)
    data = check_det_dataset(spec["data"])
    dataset = build_yolo_dataset(
        get_cfg(overrides={"imgsz": spec["imgsz"]}), data["train"], spec["batch"], data, mode="train"
    )
    loader = build_dataloader(dataset, spec["batch"], n if kind == "processes" else 0, shuffle=True)

    def batches():
        while True:
            yield from loader

    t0 = time.perf_counter()
    it = batches()
    next(it)
    first = time.perf_counter() - t0
    images, t1 = 0, time.perf_counter()
    for _ in range(spec["batches"]):
        images += len(next(it)["im_file"])
    seconds = time.perf_counter() - t1
    applied = patch.built_loaders()[-1] if patch.installed() else {"workers": 0, "threads": 0}
    result = {
        "first_batch_s": first,
        "images_per_s": images / seconds,
        "images": images,
        "workers": applied.get("workers", 0),
        "threads": applied.get("threads", 0),
    }
    print("RESULT " + json.dumps(result), flush=True)  # before close(): a worker may abort while shutting down
    loader.close()
    return result


def run_one(spec: dict, timeout: float) -> dict:
    """``measure_loading`` in a fresh interpreter (no warm imports, no leftover threads or workers)."""
    from _common import run_logged

    log = Path(spec["log"])
    code = run_logged([sys.executable, __file__, "--one", json.dumps(spec)], log.parent, log, timeout)
    text = log.read_text(errors="replace")
    lines = [x for x in text.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"measurement {spec['kind']} {spec['n']} exited with {code}; log {log}:\n{text[-2000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    if code != 0:  # measured, then failed while closing the loader: keep the figure, say so
        result["exit_after"] = code
        print(
            f"  note: {spec['kind']} {spec['n']} exited with {code} after measuring (closing the loader); log {log}",
            flush=True,
        )
    return result


# threads vs processes ----------------------------------------------------------------------------
def threads_vs_processes(a, data: Path, root: Path) -> list[str]:
    """Images/s of the main thread, of N loader threads and of N worker processes; markdown lines."""
    settings = [("main", 0)] + [("threads", n) for n in a.threads] + [("processes", n) for n in a.processes]
    results: dict[tuple, list[dict]] = {s: [] for s in settings}
    for rnd in range(1, a.rounds + 1):
        for kind, n in settings:
            spec = {
                "kind": kind,
                "n": n,
                "data": str(data),
                "imgsz": a.imgsz,
                "batch": a.batch,
                "batches": a.batches,
                "start_method": a.start_method,
                "log": str(root / f"{kind}-{n}-r{rnd}.log"),
            }
            r = run_one(spec, a.timeout)
            results[(kind, n)].append(r)
            print(
                f"  round {rnd} {kind:9s} {n:2d}: first batch {r['first_batch_s']:6.2f} s, "
                f"{r['images_per_s']:7.1f} images/s",
                flush=True,
            )
    base = statistics.median(r["images_per_s"] for r in results[("main", 0)])
    method = a.start_method or "the fast profile's"
    lines = ["| loader | first batch (s) | images/s | vs main thread |", "| --- | --- | --- | --- |"]
    for (kind, n), runs in results.items():
        label = {
            "main": "main thread (`single`, `workers=0`)",
            "threads": f"{n} loader thread(s) (`threads`)",
            "processes": f"{n} worker process(es) (`fast`, {method} start)",
        }[kind]
        rate = [r["images_per_s"] for r in runs]
        first = [r["first_batch_s"] for r in runs]
        lines.append(
            f"| {label} | {_spread(first)} | {_spread(rate, '{:.1f}')} | {statistics.median(rate) / base:.2f}x |"
        )
    return lines


def _spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--one", metavar="JSON", help=argparse.SUPPRESS)  # internal: one measurement in this process
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2, 4], help="loader thread counts (default: 1 2 4)")
    p.add_argument("--processes", type=int, nargs="*", default=[1, 2, 4], help="worker process counts (default: 1 2 4)")
    p.add_argument(
        "--start-method",
        choices=("spawn", "forkserver", "fork"),
        help="start method of the worker processes (default: the fast profile's)",
    )
    p.add_argument("--images", type=int, default=128, help="train images in the photo set (default: 128)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=16, help="batches timed after the first (default: 16)")
    p.add_argument("--rounds", type=int, default=1, help="repetitions of every setting, interleaved (default: 1)")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=600, help="seconds before one measurement is killed")
    a = p.parse_args(argv)
    if a.one:
        measure_loading(json.loads(a.one))
        return 0
    from _common import interrupted, machine_line, stop_on_signals, work_dir
    from _photos import write_photo_set

    stop_on_signals()
    if min([a.batch, a.batches, a.images, a.rounds, *a.threads, *a.processes]) < 1:
        p.error("every count must be >= 1")
    try:
        with work_dir(a.dir, "bench-loader-") as root:
            data = write_photo_set(root / "photos", train=a.images, val=8)
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            started = time.monotonic()
            lines = threads_vs_processes(a, data, root)
            command = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
            print(f"\ntotal {time.monotonic() - started:.0f} s\n")
            print(
                f"Command: `{command}`\n\nMachine: {machine_line()}\n\n"
                f"Settings: {a.images} real-photo 640x480 JPEGs, imgsz {a.imgsz}, batch {a.batch}, Ultralytics' "
                f"training augmentations; images/s over {a.batches} batches after the first, consumer idle; "
                f"{a.rounds} round(s), median (min-max)\n"
            )
            print("\n".join(lines))
            return 0
    except KeyboardInterrupt:
        return interrupted()


if __name__ == "__main__":
    sys.exit(main())
