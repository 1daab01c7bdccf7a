"""The doctor's DataLoader checks: Ultralytics' own dataset of the task and a torch DataLoader, in a subprocess.

One step per subprocess (a single process, then worker processes), each killed with its
whole process group when it overruns; its clock starts again once the data set is built (a
large set's scan may take long). The verdict is what a person would conclude: "single-process
works, multi-process hangs: use --profile single".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rocm_yolo.doctor.options import Options, loader_plan
from rocm_yolo.doctor.report import FAIL, OK, SKIP, WARN, Row, plural
from rocm_yolo.process.tree import python, run_bounded

_EVENT = "@@doctor "
MULTI_NAME = "DataLoader workers"


def loader_skipped(opts: Options, why: str) -> Iterator[Row]:
    if "loader" not in opts.skip:
        yield Row("loader.single", "DataLoader single", SKIP, f"skipped: {why}")


def _emit(kind: str, **info) -> None:
    sys.stdout.write(_EVENT + json.dumps(dict(info, event=kind, time=time.time())) + "\n")
    sys.stdout.flush()


def probe_worker_init(worker_id: int) -> None:
    """worker_init_fn of the probe's loader: reports when each worker is up."""
    _emit("worker", id=worker_id, pid=os.getpid())


def probe_main(spec_file: str) -> None:
    """Build Ultralytics' dataset and load a few batches, reporting progress as events; workers start as
    training starts them (by default forked from the preloaded fork server, as in training)."""
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)  # as the training child does, before torch
    spec = json.loads(Path(spec_file).read_text())
    method = spec.get("start_method", "forkserver")
    _emit("start")
    if spec["workers"] and method == "forkserver":
        from rocm_yolo.trainer.forkserver import server

        server.start(spec["run_dir"])  # records itself in RUN/rocm_yolo/forkserver.json, as in training
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset

    task = spec.get("task", "detect")
    cfg = get_cfg(overrides={"imgsz": spec["imgsz"], "task": task})
    names = {int(k): v for k, v in spec["names"].items()}
    if task == "classify":  # what ClassificationTrainer.build_dataset makes
        import inspect

        from ultralytics.data import ClassificationDataset

        aligned = "names" in inspect.signature(ClassificationDataset.__init__).parameters  # Ultralytics >= 8.4.154
        dataset = ClassificationDataset(
            spec["train"][0], cfg, augment=True, prefix="train", **({"names": names} if aligned else {})
        )
    else:
        data = {"names": names, "nc": len(names), "channels": spec["channels"]}
        if spec.get("kpt_shape") is not None:
            data["kpt_shape"] = spec["kpt_shape"]
        dataset = build_yolo_dataset(cfg, spec["train"], spec["batch"], data, mode="train", stride=32)
    _emit("dataset", images=len(dataset))
    workers = spec["workers"]
    kwargs = {}
    if workers:
        patch = "absent"
        try:
            from rocm_yolo.patches.loaders import dataloader as patch_module
            from rocm_yolo.run.spec import LoaderSettings

            patch_module.install(
                LoaderSettings(
                    workers=workers,
                    val_workers=None,
                    persistent_workers=False,
                    prefetch_factor=spec["prefetch"],
                    pin_memory=False,
                    timeout=0,
                    start_method=method,
                )
            )
            patch = "installed"
        except ImportError:
            pass
        _emit("patch", state=patch, start_method=method)
        kwargs = {
            "multiprocessing_context": method,
            "prefetch_factor": spec["prefetch"],
            "worker_init_fn": probe_worker_init,
        }
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=spec["batch"],
        shuffle=False,
        num_workers=workers,
        collate_fn=getattr(dataset, "collate_fn", None),
        **kwargs,
    )
    batches = min(spec["batches"], len(loader))
    it = iter(loader)
    _emit("iter", batches=batches)
    for i in range(batches):
        batch = next(it)
        _emit("batch", index=i, shape=list(batch["img"].shape))
    del it
    _emit("done")


@dataclass
class ProbeResult:
    state: str  # "ok", "timeout", "crash", "error"
    events: list[dict]
    seconds: float
    message: str = ""
    stderr_tail: list[str] = field(default_factory=list)

    def first(self, kind: str) -> dict | None:
        return next((e for e in self.events if e["event"] == kind), None)

    def all(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith(_EVENT):
            try:
                out.append(json.loads(line[len(_EVENT) :]))
            except ValueError:
                pass
    return out


def run_probe(opts: Options, spec: dict, build_timeout: float) -> ProbeResult:
    """One probe step; its clock: ``build_timeout`` until the data set is built, then ``opts.timeout``."""
    run_dir = tempfile.mkdtemp(prefix="rocm-yolo-doctor-")  # the fork server's record goes here
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(dict(spec, run_dir=run_dir), f)
    code = "import sys; from rocm_yolo.doctor.loader_probe import probe_main; probe_main(sys.argv[1])"
    try:  # the step's own clock starts when the data set is built
        outcome = run_bounded(
            python("-c", code, f.name, executable=opts.python),
            build_timeout,
            dict(os.environ),
            rebase=lambda out: opts.timeout if any(e["event"] == "dataset" for e in _events(out)) else None,
        )
    finally:
        os.unlink(f.name)
        shutil.rmtree(run_dir, ignore_errors=True)
    events = _events(outcome.stdout)
    tail = outcome.tail(4)
    if outcome.timed_out:
        return ProbeResult("timeout", events, outcome.seconds, stderr_tail=tail)
    if any(e["event"] == "done" for e in events):
        return ProbeResult("ok", events, outcome.seconds, stderr_tail=tail)
    rc = outcome.returncode
    message = tail[-1] if tail else f"exit code {rc}"
    if outcome.signal_name:
        return ProbeResult("crash", events, outcome.seconds, f"killed by {outcome.signal_name}", tail)
    return ProbeResult("error", events, outcome.seconds, message, tail)


def check_loader(opts: Options, data: dict, torch_error: str | None = None) -> Iterator[Row]:
    """``data``: the task, names, channels, kpt_shape and train paths the probe builds its dataset from."""
    if torch_error is not None:  # the probe needs torch: its failure would blame the data
        yield from loader_skipped(opts, f"torch cannot be imported ({torch_error}); see the torch row")
        return
    plan = loader_plan(opts)
    workers = opts.workers if opts.workers is not None else plan["workers"]
    batch = min(opts.batch, 8)
    base = dict(
        data,
        names={str(k): v for k, v in data["names"].items()},
        imgsz=min(opts.imgsz, 160),
        batch=batch,
        prefetch=plan["prefetch"] or 2,
        start_method=plan["start_method"],
    )
    build_timeout = max(opts.timeout, 300.0)
    single = run_probe(opts, dict(base, workers=0, batches=3), build_timeout)
    yield _single_row(opts, single)
    if single.state != "ok":
        reason = "the single-process load failed" if single.state != "timeout" else "the single-process load hung"
        if workers:
            yield Row("loader.multi", MULTI_NAME, SKIP, f"skipped: {reason}")
        return
    if workers == 0:
        yield Row(
            "loader.multi",
            MULTI_NAME,
            SKIP,
            "workers=0: no worker processes to test (--workers N to test them)",
        )
        return
    multi = run_probe(opts, dict(base, workers=workers, batches=max(3, 2 * workers)), build_timeout)
    yield from _multi_rows(opts, single, multi, workers)


def plan_method(r: ProbeResult) -> str:
    """How the probe's workers were started: ``forkserver`` (preloaded, as in training), ``spawn``, ..."""
    return (r.first("patch") or {}).get("start_method") or "forkserver"


def _took(result: ProbeResult, kind: str) -> float | None:
    it, e = result.first("iter"), result.first(kind)
    return None if it is None or e is None else e["time"] - it["time"]


def _single_row(opts: Options, r: ProbeResult) -> Row:
    name, check = "DataLoader single", "loader.single"
    data = {"state": r.state, "seconds": round(r.seconds, 2)}
    if r.state == "ok":
        n, first = len(r.all("batch")), _took(r, "batch")
        shape = r.all("batch")[-1]["shape"] if n else None
        return Row(
            check,
            name,
            OK,
            f"{plural(n, 'batch')} in the main process, first after {first:.1f} s (batch {shape})",
            data=data,
        )
    built = r.first("dataset") is not None
    if r.state == "timeout":
        where = "loading batches" if built else "building the data set"
        return Row(
            check,
            name,
            FAIL,
            f"single-process load hung while {where} (no progress in {opts.timeout:g} s)",
            "a file blocks reading (see the data rows) or the storage is very slow; copy the data to a local disk",
            r.stderr_tail,
            dict(data, verdict="loading hangs even in a single process: the data or its storage is the problem"),
        )
    return Row(
        check,
        name,
        FAIL,
        f"single-process load failed: {r.message}",
        "fix the data set (see the data rows and the error above)",
        r.stderr_tail,
        dict(data, verdict="loading fails even in a single process: the data is the problem"),
    )


def _multi_rows(opts: Options, single: ProbeResult, r: ProbeResult, workers: int) -> Iterator[Row]:
    name, check = MULTI_NAME, "loader.multi"
    up = r.all("worker")
    patch = (r.first("patch") or {}).get("state", "?")
    data = {
        "state": r.state,
        "workers": workers,
        "workers_started": len(up),
        "patch": patch,
        "seconds": round(r.seconds, 2),
    }
    method = plan_method(r)
    label = f"{workers} {method} worker{'s' if workers > 1 else ''}"
    if r.state == "ok":
        n = len(r.all("batch"))
        yield Row(check, name, OK, f"{label}: {plural(n, 'batch')}", data=data)
    elif r.state == "timeout":
        started = f"{len(up)}/{workers} workers started, " if r.first("iter") else ""
        got = len(r.all("batch"))
        yield Row(
            check,
            name,
            FAIL,
            f"{label}: {started}{plural(got, 'batch')}, then no progress for {opts.timeout:g} s (hang)",
            "train with --profile single (no worker processes); --profile safe may also get through",
            r.stderr_tail,
            dict(data, verdict="single-process works, multi-process hangs: use --profile single"),
        )
    else:
        shm = " (/dev/shm too small? see the shared memory row)" if "bus error" in (r.message or "").lower() else ""
        yield Row(
            check,
            name,
            FAIL,
            f"{label}: {r.state}: {r.message}{shm}",
            "train with --profile single (no worker processes)",
            r.stderr_tail,
            dict(data, verdict="single-process works, multi-process crashes: use --profile single"),
        )
    if up and r.first("iter"):
        startup = max(e["time"] for e in up) - r.first("iter")["time"]
        first = _took(r, "batch")
        found = f"{len(up)} workers up after {startup:.1f} s" + (f", first batch after {first:.1f} s" if first else "")
        status = WARN if startup > 60 else OK
        yield Row(
            "loader.startup",
            "worker start-up",
            status,
            found,
            (
                "slow start-up: each spawned worker imports torch; fewer --workers start faster"
                if method == "spawn"
                else "slow start-up: is the machine short of memory or CPU? fewer --workers start faster"
            )
            if status == WARN
            else None,
            data={"startup": round(startup, 2), "first_batch": first and round(first, 2)},
        )
    else:
        yield Row("loader.startup", "worker start-up", SKIP, "no worker reported start-up")
