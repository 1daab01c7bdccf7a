"""What keeping torch's DataLoader contract costs under the fork server, against plain torch (issue 27, items 3 and 6).

Two measurements, each side in a fresh process, the sides in turn for ``--rounds`` rounds:

- ``modules``: ``--loaders`` loaders of 2 workers, one epoch each, over a dataset defined in a module
  of its own that imports ``torchvision.transforms.v2`` (a user's dataset module with a slow import).
  Plain torch forks its workers from the process that imported the module already; a fork-server
  worker has to import it, unless the server imported it before it forked (``trainer/forkserver/preimport``).
- ``death``: a worker killed by SIGKILL after the first batch: seconds until the loader raises.
  torch learns of its own children's deaths from SIGCHLD; the fork server's workers are the
  server's children (``patches/loaders/worker_deaths`` reads their exit status).

Sides: ``plain`` (torch's default start method, fork on Linux), ``before`` (the DataLoader patch and
the fork server without the part measured: no module named to the server, or no exit-status
watch) and ``after`` (all of it, as the training child installs it).

    python benchmarks/bench_loader_contract.py
    python benchmarks/bench_loader_contract.py --rounds 5 --loaders 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import interrupted, machine_line, run_logged, stop_on_signals, work_dir

SIDES = ("plain", "before", "after")
DATASET_MODULE = """\
import time

import torchvision.transforms.v2  # noqa: F401 - what makes the import slow
from torch.utils.data import Dataset


class Numbers(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return i


class Busy(Numbers):
    def __getitem__(self, i):
        time.sleep(0.2)  # a worker is killed while it works on an item
        return i
"""


def _setup(side: str, what: str, run: Path) -> None:
    if side == "plain":
        return
    from rocm_yolo.trainer.forkserver import server as forkserver

    forkserver.start(run)
    if side == "before" and what == "modules":
        os.environ.pop("ROCM_YOLO_FORKSERVER_IMPORTS")  # the loader names no module to the server
    from rocm_yolo.patches.loaders import dataloader, worker_deaths
    from rocm_yolo.policy.profiles import resolve

    dataloader.install(resolve("fast", 2, cpu_count=4).loader, run)
    if side == "before" and what == "death":
        worker_deaths.uninstall()


def measure(side: str, what: str, loaders: int, run: Path) -> float:
    """In the side's own process: the seconds ``what`` takes."""
    _setup(side, what, run)
    sys.path.insert(0, str(run))
    import signal

    import slow_dataset
    import torch  # noqa: F401
    from torch.utils.data import DataLoader

    if what == "modules":
        # one loader before the clock: the fork server is up, and has imported the module once as this process
        # did at ``import slow_dataset`` (plain fork's workers inherit that import)
        assert sum(int(b.sum()) for b in DataLoader(slow_dataset.Numbers(), batch_size=2, num_workers=2)) == 120
        began = time.monotonic()
        for _ in range(loaders):
            assert sum(int(b.sum()) for b in DataLoader(slow_dataset.Numbers(), batch_size=2, num_workers=2)) == 120
        return time.monotonic() - began
    iterator = iter(DataLoader(slow_dataset.Busy(), batch_size=1, num_workers=2))
    next(iterator)
    time.sleep(1)
    os.kill(iterator._workers[0].pid, signal.SIGKILL)
    began = time.monotonic()
    try:
        for _ in iterator:
            time.sleep(0.01)
    except (RuntimeError, ConnectionError, EOFError) as e:  # torch's error, or a queue broken by the death
        seconds = time.monotonic() - began
        print(json.dumps({"seconds": seconds, "named": str(iterator._workers[0].pid) in _chain(e)}))
        raise SystemExit(0)
    raise SystemExit("the loader did not notice its dead worker")


def _chain(error: BaseException) -> str:
    text = ""
    while error is not None:
        text += f"{error}\n"
        error = error.__cause__ or error.__context__
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loaders", type=int, default=10, help="loaders per 'modules' run")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--dir", type=Path, help="keep the runs and logs here (default: a temporary directory)")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one run, in its own process
    p.add_argument("--what", choices=("modules", "death"), help=argparse.SUPPRESS)
    p.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        print(json.dumps({"seconds": measure(a.side, a.what, a.loaders, a.run), "named": None}))
        return 0
    stop_on_signals()
    results: dict = {(what, side): [] for what in ("modules", "death") for side in SIDES}
    named: dict = {key: [] for key in results}  # death: whether the error named the dead worker
    try:
        with work_dir(a.dir, "bench-loader-contract-") as root:
            print(f"work directory: {root}\n{machine_line()}", flush=True)
            for rnd in range(1, a.rounds + 1):
                for what, side in results:
                    run = Path(tempfile.mkdtemp(prefix=f"{what}-{side}-{rnd}-", dir=root))
                    (run / "slow_dataset.py").write_text(DATASET_MODULE)
                    log = run / "log.txt"
                    cmd = [sys.executable, __file__, "--side", side, "--what", what, "--run", str(run)]
                    code = run_logged([*cmd, "--loaders", str(a.loaders)], Path(__file__).parent, log, a.timeout)
                    lines = [x for x in log.read_text().splitlines() if x.startswith("{")]
                    if code or not lines:
                        raise SystemExit(f"the {side} run of {what} failed (exit {code}): see {log}")
                    found = json.loads(lines[-1])
                    results[what, side].append(found["seconds"])
                    named[what, side].append(found["named"])
                    print(f"round {rnd}: {what} {side}: {results[what, side][-1]:.2f} s", flush=True)
    except KeyboardInterrupt:
        return interrupted()
    print("\n| measurement | plain (s) | before (s) | after (s) | after / plain |")
    print("|---|---:|---:|---:|---:|")
    titles = {"modules": f"{a.loaders} loaders x 2 workers, slow dataset module", "death": "dead worker noticed"}
    for what, title in titles.items():
        cells = [results[what, side] for side in SIDES]
        med = [statistics.median(c) for c in cells]
        span = [f"{statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f})" for c in cells]
        if what == "death":
            span = [f"{x}, named {sum(named[what, side])}/{len(named[what, side])}" for x, side in zip(span, SIDES)]
        print(f"| {title} | {' | '.join(span)} | {med[2] / med[0]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
