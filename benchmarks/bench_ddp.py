"""Per-epoch time of a multi-GPU (DDP) run: rocm-yolo against plain Ultralytics DDP, interleaved, in one run.

Each round runs both sides once, in turn, each in a fresh process:

- ``plain``: ``YOLO("yolo26n.yaml").train(device="0,1", workers=W, ...)``, Ultralytics' own
  launch of its ranks (``generate_ddp_command``: ``torch.distributed.run`` and a generated script);
- ``rocm-yolo``: ``rocm-yolo train --device 0,1 --workers W ...`` with the default profile:
  the launcher, one rank per GPU with its fork server, heartbeat, watchdog and mid-epoch
  checkpoint callbacks.

With ``--nodes N`` both sides train on N "nodes" of this machine, each ``--device`` a node's GPUs,
meeting at torch's c10d rendezvous on 127.0.0.1 (a free port each run):

- ``plain``: on each node ``torchrun --nnodes N --nproc_per_node n --rdzv-backend c10d
  --rdzv-endpoint 127.0.0.1:P``, each rank running ``YOLO("yolo26n.yaml").train(...)`` with the one
  change Ultralytics needs to train on more than one machine at all: its trainer's world size set to
  torch's ``WORLD_SIZE`` (it counts this node's GPUs, ultralytics#22878);
- ``rocm-yolo``: on each node ``rocm-yolo train --device 0,1 --nnodes N --node-rank K --rdzv-endpoint
  127.0.0.1:P``, each node under its own supervisor.

Per-epoch time is the difference of the cumulative ``time`` column of results.csv (rank 0
writes it). Epoch 1 (start-up) and the last epoch (the final validation) are left out. The
ratio is taken per round, then the median (min-max) over rounds. The goal is at most 1.03.

Without GPUs (``--cpu``, the default when torch sees none), both sides run on CPU "devices"
through the tests' seam (``tests/seams``: gloo, Ultralytics' DDP code otherwise unchanged).
Then the figures measure rocm-yolo's overhead around DDP, not GPU training.

    python benchmarks/bench_ddp.py                                    # 2 CPU ranks, synthetic data
    python benchmarks/bench_ddp.py --nodes 2 --train 256 --epochs 4   # 2 nodes x 2 CPU ranks
    python benchmarks/bench_ddp.py --device 0,1 --imgsz 640 --batch 32 --workers 4 --train 1000 --no-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import interleaved, machine_line, run_logged, size_args, stop_on_signals  # noqa: E402
from bench_train import epoch_times, spread  # noqa: E402

SEAM = HERE.parent / "tests" / "seams"
SIDES = ("plain", "rocm-yolo")
PLAIN_RUNNER = """\
import json, sys
from ultralytics import YOLO
YOLO("yolo26n.yaml").train(**json.loads(sys.argv[1]))
"""
# a rank of plain torchrun on several nodes: Ultralytics' trainer, with torch's global world size
PLAIN_RANK = """\
import json, os, sys
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

class Trainer(DetectionTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.world_size = int(os.environ["WORLD_SIZE"])  # Ultralytics counts this node's devices only

YOLO("yolo26n.yaml").train(trainer=Trainer, **json.loads(sys.argv[1]))
"""


def train_args(a, data: Path) -> dict:
    return {
        "data": str(data),
        "device": a.device,
        "epochs": a.epochs,
        "imgsz": a.imgsz,
        "batch": a.batch,
        "workers": a.workers,
        "val": False,
        "plots": False,
    }


def command(a, side: str, data: Path, project: Path, name: str, node: int = 0, port: int = 0) -> list[str]:
    """One side's command (of ``node``, meeting the others at ``port``, with ``--nodes``)."""
    if side == "plain":
        args = {**train_args(a, data), "project": str(project), "name": name, "exist_ok": True}
        if a.nodes == 1:
            return [sys.executable, "-c", PLAIN_RUNNER, json.dumps(args)]
        runner = project / "plain_rank.py"
        runner.write_text(PLAIN_RANK)
        return [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(a.nodes),
            "--nproc_per_node", str(len(a.device.split(","))), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", name, str(runner), json.dumps(args),
        ]  # fmt: skip
    nodes = ["--nnodes", str(a.nodes), "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    return [
        sys.executable,
        "-m",
        "rocm_yolo",
        "train",
        str(data),
        "--model",
        "yolo26n.yaml",
        "--device",
        a.device,
        "--workers",
        str(a.workers),
        *size_args(a),
        "val=False",
        "plots=False",
        "--project",
        str(project),
        "--name",
        name,
        *(nodes if a.nodes > 1 else []),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seam_env(cpu: bool) -> dict:
    if not cpu:
        return {}
    path = os.pathsep.join(x for x in (str(SEAM), os.environ.get("PYTHONPATH")) if x)
    return {"PYTHONPATH": path, "ROCM_YOLO_TEST_CPU_DDP": "1", "ROCM_YOLO_KFD_ROOT": str(SEAM / "kfd" / "nodes")}


def one_run(a, side: str, rnd: int, data: Path, root: Path) -> list[float]:
    project, name = root / side, f"r{rnd}"
    project.mkdir(parents=True, exist_ok=True)
    port = free_port()
    logs = [root / (f"{side}-{name}" + (f"-node{k}" if a.nodes > 1 else "") + ".log") for k in range(a.nodes)]
    t0 = time.monotonic()

    def node(k: int) -> int:
        cmd = command(a, side, data, project, name, k, port)
        return run_logged(cmd, root, logs[k], a.timeout, env=seam_env(a.cpu))

    with ThreadPoolExecutor(a.nodes) as pool:  # every node at once: they meet at the rendezvous
        codes = list(pool.map(node, range(a.nodes)))
    for code, log in zip(codes, logs):
        if code != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{side} run {name} exited with {code}; log {log}:\n{tail}")
    times = epoch_times(project / name / "results.csv")
    epochs = " ".join(f"{t:.2f}" for t in times)
    print(f"  round {rnd} {side:9s}: {time.monotonic() - t0:5.1f} s wall, epochs {epochs}", flush=True)
    return times


def report(a, results: dict) -> list[str]:
    measured = list(range(1, a.epochs - 1))
    mean = {side: [statistics.mean(run[e] for e in measured) for run in runs] for side, runs in results.items()}
    ratios = [x / y for x, y in zip(mean["rocm-yolo"], mean["plain"])]
    command_line = " ".join(["python", f"benchmarks/{Path(__file__).name}", shlex.join(sys.argv[1:])]).strip()
    where = "CPU ranks through tests/seams (gloo)" if a.cpu else "GPUs"
    if a.nodes > 1:
        where += f", on each of {a.nodes} nodes of this machine (c10d rendezvous on 127.0.0.1; plain: torchrun)"
    return [
        f"Command: `{command_line}`",
        "",
        f"Machine: {machine_line()}",
        "",
        f"Settings: --device {a.device} on {where}, {a.train} train images, imgsz {a.imgsz}, batch {a.batch} "
        f"(split across the ranks), workers {a.workers} a rank, {a.epochs} epochs, val=False, {a.rounds} interleaved "
        f"rounds; mean epoch time of epochs {measured[0] + 1}-{measured[-1] + 1} in s, median (min-max) over rounds",
        "",
        "| side | epoch s | epoch 1 s (start-up) |",
        "| --- | --- | --- |",
        *(f"| {side} | {spread(mean[side])} | {spread([run[0] for run in results[side]])} |" for side in SIDES),
        "",
        f"rocm-yolo / plain, per round: {spread(ratios, '{:.3f}')} (goal: <= 1.03)",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="0,1", help="the GPUs of both sides (default: 0,1), of each node")
    p.add_argument("--nodes", type=int, default=1, help="nodes on this machine, each with --device (default: 1)")
    p.add_argument("--cpu", action=argparse.BooleanOptionalAction, default=None, help="CPU ranks through the seam")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers a rank (default: 1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5, help=">= 3 (default: 5)")
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="the whole batch, split across the ranks (default: 8)")
    p.add_argument("--train", type=int, default=64, help="train images in the generated data set (default: 64)")
    p.add_argument("--dir", type=Path, help="work directory, kept (default: a temporary one, removed)")
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args(argv)
    stop_on_signals()
    if a.epochs < 3 or a.rounds < 1 or a.nodes < 1:
        p.error("--epochs must be >= 3, --rounds and --nodes >= 1")
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        p.error("plain Ultralytics' DDP launch pickles the trainer with cloudpickle: pip install 'cloudpickle>=3.1.1'")
    if a.cpu is None:
        import torch

        a.cpu = not torch.cuda.is_available()
    return interleaved(a, "bench-ddp-", SIDES, one_run, report, val=16)


if __name__ == "__main__":
    sys.exit(main())
