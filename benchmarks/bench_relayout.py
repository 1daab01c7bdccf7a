"""Change the GPUs, keep the run: what a resume on another number of GPUs trains, measured.

Each scenario trains the demo set (``--train`` images) once uninterrupted (the reference) and once stopped in
epoch 2 by a SIGKILL of its trainer halfway through a mid-epoch checkpoint's write (rank 0, no restart), then
resumed with ``--resume RUN --device ...`` on the other number of GPUs; every trained image and optimizer step is
recorded (the testing plugin's ``ROCM_YOLO_RECORD_BATCHES``). It prints what the resume said, and:

- epoch 2's images trained twice (the batches between the checkpoint and the kill) and never;
- the steps from the checkpoint on whose images or optimizer step differ from the reference's;
- the largest images of one micro-batch on one GPU, against the run's own;
- the largest difference of the trainable weights (float32) from the reference's at the end.

``--scenario lost`` instead runs two nodes of two GPUs with ``--nnodes 1:2`` and SIGKILLs node 1's supervisor in
epoch 2: the seconds from the kill to node 0's first trained step on its own, and the lines it said.

On this machine the GPUs are CPU ranks through the tests' seam (``tests/seams``: ``--device 0,1`` is two CPU ranks
with gloo); with ``--no-cpu`` they are the machine's GPUs. SGD, augmentation off, ``deterministic=True``,
``--profile single``: the same samples every time (AdamW would let the last bits of the gradient sums decide the
updates of parameters whose gradients are near zero)::

    python benchmarks/bench_relayout.py                      # 2 GPUs -> 1 and 1 -> 2: about 4 minutes on 2 cores
    python benchmarks/bench_relayout.py --scenario lost      # two nodes, one lost for good: about 3 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

from _common import TAG_VAR, machine_line, run_logged, stop_on_signals, work_dir

from rocm_yolo.process.tagged import Tagged

HERE = Path(__file__).resolve().parent
SEAM = HERE.parent / "tests" / "seams"
RECORD = "ROCM_YOLO_RECORD_BATCHES"
SAME = [
    *("--model", "yolo26n.yaml", "--epochs", "3", "--profile", "single", "--checkpoint-every", "1ba", "plots=False"),
    *("val=False", "seed=0", "deterministic=True", "optimizer=SGD", "lr0=0.01", "mosaic=0", "fliplr=0", "hsv_h=0"),
    *("hsv_s=0", "hsv_v=0", "translate=0", "scale=0", "close_mosaic=0"),
]


def seam_env(cpu: bool) -> dict:
    if not cpu:
        return {}
    path = os.pathsep.join(x for x in (str(SEAM), os.environ.get("PYTHONPATH")) if x)
    return {"PYTHONPATH": path, "ROCM_YOLO_TEST_CPU_DDP": "1", "ROCM_YOLO_KFD_ROOT": str(SEAM / "kfd" / "nodes")}


def train(a, root: Path, data: Path, name: str, device: str, batch: int, fault: str = "") -> Path:
    record = root / f"{name}.jsonl"
    env = {**seam_env(a.cpu), "ROCM_YOLO_PLUGINS": "rocm_yolo.testing", RECORD: str(record)}
    if fault:
        env["ROCM_YOLO_FAULT"] = fault
    cmd = [sys.executable, "-m", "rocm_yolo", "train", str(data), *SAME, "--imgsz", str(a.imgsz), "--device", device]
    cmd += ["--batch", str(batch), "--project", str(root / "runs"), "--name", name]
    cmd += ["--max-restarts", "0"] if fault else []
    code = run_logged(cmd, root, root / f"{name}.log", a.timeout, env)
    if code != (1 if fault else 0):
        raise SystemExit(f"{name}: exit {code}; its log: {root / f'{name}.log'}")
    return record


def resume(a, root: Path, name: str, device: str) -> str:
    env = {**seam_env(a.cpu), "ROCM_YOLO_PLUGINS": "rocm_yolo.testing", RECORD: str(root / f"{name}.jsonl")}
    cmd = [sys.executable, "-m", "rocm_yolo", "train", "--resume", str(root / "runs" / name), "--device", device]
    log = root / f"{name}-resume.log"
    code = run_logged(cmd, root, log, a.timeout, env)
    if code != 0:
        raise SystemExit(f"{name}: the resume exited {code}; its log: {log}")
    return log.read_text(errors="replace")


def steps(record: Path, attempt: int) -> dict:
    out: dict = {}
    for line in record.read_text().splitlines():
        r = json.loads(line)
        if r["attempt"] == attempt:
            step = out.setdefault((r["epoch"], r["batch"]), {"files": Counter(), "stepped": r["stepped"], "parts": []})
            step["files"] += Counter(r["files"])
            step["parts"] += r["parts"]
    return out


def compare(root: Path, name: str, reference: Path, run_batch: int) -> list[str]:
    import torch

    record = root / f"{name}.jsonl"
    events = [json.loads(x) for x in (root / "runs" / name / "rocm_yolo" / "events.jsonl").read_text().splitlines()]
    done = next(e["batch"] for e in events if e["event"] == "resumed")
    ref, first, again = steps(reference, 1), steps(record, 1), steps(record, 2)
    epoch2 = Counter(f for (e, _), s in ref.items() if e == 2 for f in s["files"])
    trained = sum((s["files"] for (e, _), s in first.items() if e == 2), Counter())
    trained += sum((s["files"] for (e, _), s in again.items() if e == 2), Counter())
    twice = sum(n - 1 for f, n in trained.items() if n > 1)
    never = sum(1 for f in epoch2 if f not in trained)
    differ = sum(1 for k, s in again.items() if (s["files"], s["stepped"]) != (ref[k]["files"], ref[k]["stepped"]))
    largest = max(max(s["parts"]) for s in again.values())
    mine, theirs = torch.load(f"{record}.weights.pt"), torch.load(f"{reference}.weights.pt")
    worst = max((mine[k] - theirs[k]).abs().max().item() for k in mine)
    return [
        f"  resumed at epoch 2, step {done}: of epoch 2's {sum(epoch2.values())} images {twice} trained twice "
        f"(the steps between the checkpoint and the kill), {never} never",
        f"  steps from the checkpoint on: {len(again)}, {differ} with other images or another optimizer step than "
        "the reference's",
        f"  the most images of one micro-batch on one GPU: {largest} (the run's own: {run_batch})",
        f"  trainable weights at the end against the reference's: largest difference {worst:.2g}",
    ]


def direction(a, root: Path, data: Path, before: str, after: str, batch: int) -> list[str]:
    name = f"{before.replace(',', '')}-to-{after.replace(',', '')}"
    reference = train(a, root, data, f"{name}-ref", before, batch)
    train(a, root, data, name, before, batch, fault="save-kill@2:2")
    said = resume(a, root, name, after)
    lines = [x for x in said.splitlines() if x.startswith("rocm-yolo:") and ("world" in x or "resumed at" in x)]
    gpus = lambda d: len(d.split(","))  # noqa: E731
    per_rank = batch // gpus(before)
    return [f"--device {before} -> {after} (batch {batch}):", *(f"  {x}" for x in lines)] + compare(
        root, name, reference, per_rank
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lost(a, root: Path, data: Path) -> list[str]:
    """Two nodes of two GPUs, --nnodes 1:2; node 1's supervisor SIGKILLed in epoch 2, never started again."""
    from rocm_yolo.run import heartbeat
    from rocm_yolo.run.paths import RunPaths

    run = root / "runs" / "lost"
    port = free_port()
    tagged = Tagged(TAG_VAR)
    procs = []
    try:
        for node in (0, 1):
            cmd = [sys.executable, "-m", "rocm_yolo", "train", str(data), "--model", "yolo26n.yaml", "--device", "0,1"]
            cmd += ["--imgsz", str(a.imgsz), "--batch", "8", "--epochs", "4", "--project", str(run.parent)]
            cmd += ["--workers", "1", "--checkpoint-every", "2ba", "plots=False"]
            cmd += ["--name", run.name, "--nnodes", "1:2", "--node-rank", str(node), "--rdzv-endpoint"]
            cmd += [f"127.0.0.1:{port}", "--rdzv-timeout", str(a.rdzv_timeout), "--stall-timeout", "20"]
            out = open(root / f"node-{node}.log", "w")
            procs.append(tagged.start(cmd, cwd=root, output=out, extra=seam_env(a.cpu)))
        deadline = time.monotonic() + a.timeout
        while getattr(heartbeat.read(RunPaths(run, 1).heartbeat), "epoch", 0) < 2:
            if time.monotonic() > deadline or procs[1].poll() is not None:
                raise SystemExit(f"node 1 did not reach epoch 2; its log: {root / 'node-1.log'}")
            time.sleep(0.2)
        killed = time.monotonic()
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        alone = None
        while procs[0].poll() is None and time.monotonic() < deadline:
            beat = heartbeat.read(RunPaths(run, 0).heartbeat)
            if alone is None and beat is not None and beat.world == 2 and beat.batches_total > 0:
                alone = time.monotonic() - killed
            time.sleep(0.2)
        code = procs[0].wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for proc in procs:
            tagged.stop(proc)
    said = [x for x in (root / "node-0.log").read_text().splitlines() if x.startswith("rocm-yolo:")]
    keep = ("is gone", "meeting the other nodes", "world 4", "done:")
    return [
        f"two nodes of 2 GPUs, --nnodes 1:2 --rdzv-timeout {a.rdzv_timeout}, node 1's supervisor SIGKILLed in epoch 2:",
        *(f"  {x}" for x in said if any(k in x for k in keep)),
        f"  node 0 exited {code}; from the kill to its first step on its own: "
        + (f"{alone:.0f} s" if alone is not None else "never"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=("directions", "lost"), default="directions")
    p.add_argument("--train", type=int, default=64, help="images in the demo set (default 64)")
    p.add_argument("--imgsz", type=int, default=32)
    p.add_argument("--rdzv-timeout", type=int, default=20, help="--scenario lost: the nodes' --rdzv-timeout")
    p.add_argument("--no-cpu", dest="cpu", action="store_false", help="real GPUs, not CPU ranks through the seam")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("--dir", type=Path, help="work directory (kept); default: a temporary one")
    a = p.parse_args(argv)
    stop_on_signals()
    try:
        with work_dir(a.dir, "bench-relayout-") as root:
            from rocm_yolo.request.demo import write_demo

            data = write_demo(root / "data", train=a.train, val=4, size=max(a.imgsz, 48))
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            if a.scenario == "lost":
                lines = lost(a, root, data)
            else:
                lines = direction(a, root, data, "0,1", "0", 16) + direction(a, root, data, "0", "0,1", 8)
            print("\n".join(lines))
            return 0
    except KeyboardInterrupt:
        print("\ninterrupted: every run's processes are stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
