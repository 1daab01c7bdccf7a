"""The doctor's data set and DataLoader checks.

Data: each task's data is read the way Ultralytics reads it (:mod:`rocm_yolo.datasets`: a
dataset YAML with YOLO label files for detect, segment, pose and obb; a class-per-folder
directory for classify), then every image is decoded and every label line checked against
the task's format, in a thread pool (OpenCV releases the GIL). A FIFO, socket or device
file is reported and never opened: opening it would block, which is how such a file hangs a
training run. The task is ``--task``, else what the data says: a directory is classify, a
YAML with ``kpt_shape`` pose, any other YAML detect (whose lines may be boxes or polygons).

DataLoader: Ultralytics' own dataset of the task (``build_yolo_dataset`` or
``ClassificationDataset``) and a torch DataLoader, in a subprocess per step (single
process, then spawn workers), each killed with its whole process group when it overruns;
the verdict is what a person would conclude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rocm_yolo.datasets import (  # noqa: F401 - re-exported: the doctor's readers live there now
    IMG_FORMATS, DataError, DataSpec, LabelFormat, check_image, check_label, classify_images, image_files,
    label_format, label_path, load_classify_spec, load_spec,
)
from rocm_yolo.doctor_model import FAIL, OK, SKIP, WARN, Options, Row, loader_plan
from rocm_yolo.proctree import kill_now, read_file, signal_name, start_captured
from rocm_yolo.tasks import CLASSIFY, DETECT, POSE

SHOW = 5  # file names shown per problem in the table (all of them go into --json, up to MAX_LISTED)
MAX_LISTED = 1000
_EVENT = "@@doctor "


@dataclass
class SplitReport:
    images: int = 0
    labels: int = 0
    problems: dict[str, list[str]] = field(default_factory=dict)

    def add(self, problem: tuple[str, str] | None) -> None:
        if problem:
            self.problems.setdefault(problem[0], []).append(problem[1])

    def count(self, kind: str) -> int:
        return len(self.problems.get(kind, []))


class _Progress:
    """``checking train: 1234/5000`` on stderr, only when it is a terminal."""

    def __init__(self, enabled: bool, label: str, total: int):
        self.enabled, self.label, self.total, self.done, self.last = enabled, label, total, 0, 0.0
        self.lock = threading.Lock()

    def step(self) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += 1
            now = time.monotonic()
            if now - self.last > 0.1 or self.done == self.total:
                self.last = now
                width = 30
                filled = width * self.done // max(self.total, 1)
                sys.stderr.write(f"\r  checking {self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}")
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 80 + "\r")
            sys.stderr.flush()


def scan_split(files: list[str], nc: int, fmt: LabelFormat | None, threads: int, progress: _Progress) -> SplitReport:
    """Decode every image and, unless ``fmt`` is None (classification), check its label file."""
    report = SplitReport(images=len(files))

    def one(path: str):
        result = check_image(path), (check_label(label_path(path), nc, fmt) if fmt else ("nolabel", ""))
        progress.step()
        return result

    try:
        import cv2

        cv2.setLogLevel(0)  # no libjpeg warnings on the terminal: problems are reported in rows
    except Exception:  # noqa: BLE001
        pass
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for image_problem, label_problem in pool.map(one, files, chunksize=16):
            report.add(image_problem)
            if label_problem and label_problem[0] == "nolabel":
                continue
            report.labels += 1
            report.add(label_problem)
    progress.close()
    for v in report.problems.values():
        del v[MAX_LISTED:]
    return report


_PROBLEMS = (  # kind, description, blocks training?
    ("special", "not regular files (a FIFO blocks the loader forever)", True),
    ("boxrow", "box-only label files where the task needs polygons (Ultralytics refuses the data set)", True),
    ("missing", "listed but missing", False),
    ("corrupt", "corrupt images (Ultralytics skips them)", False),
    ("badlabel", "malformed label files (Ultralytics skips those images)", False),
    ("badclass", "labels with class ids out of range of names (Ultralytics skips those images)", False),
    ("truncated", "truncated JPEGs", False),
    ("loose", "images outside any class folder (Ultralytics ignores them)", False),
    ("emptyclass", "class folders without images", False),
    ("extraclass", "class folders the train split lacks (Ultralytics skips their images)", False),
    ("missingclass", "classes of the train split without images here", False),
)
_UNUSABLE = ("special", "missing", "corrupt", "badlabel", "badclass", "boxrow")


def _problem_details(report: SplitReport) -> tuple[str, list[str]]:
    details, status = [], OK
    for kind, what, blocks in _PROBLEMS:
        items = report.problems.get(kind, [])
        if not items:
            continue
        status = FAIL if blocks else (WARN if status == OK else status)
        details.append(f"{len(items)} {what}:")
        details += [f"  {x}" for x in items[:SHOW]] + ([f"  ... and {len(items) - SHOW} more (--json lists them)"]
                                                      if len(items) > SHOW else [])
    return status, details


def split_row(split: str, report: SplitReport, nc: int, fmt: LabelFormat = LabelFormat()) -> Row:
    fixes = []
    status, details = _problem_details(report)
    usable = report.images - sum(report.count(k) for k in _UNUSABLE)
    if report.problems.get("special"):
        fixes.append("remove or replace the non-regular files named above")
    if report.problems.get("corrupt") or report.problems.get("missing"):
        fixes.append("re-export or delete the corrupt/missing images")
    if report.problems.get("badclass"):
        fixes.append(f"fix the class ids or complete 'names' ({nc} classes) in the YAML")
    if report.problems.get("badlabel"):
        fixes.append(f"fix the label lines named above: {fmt.task} lines have {fmt.expected()} numbers, "
                     "coordinates normalized to 0..1")
    if report.problems.get("boxrow"):
        fixes.append(f"give every object of a {fmt.task} data set a polygon (class x1 y1 x2 y2 ...), "
                     "or train a detection model on it")
    found = f"{report.images} images, {report.labels} label files"
    if report.images == 0:
        status, found = FAIL, "no images found"
        fixes = ["put images (jpg, png, ...) under the path in the YAML"]
    elif usable <= 0:
        status = FAIL
        found += ", none usable"
    elif report.labels == 0 and split == "train":
        status = FAIL if status == FAIL else WARN
        found += f" (expected labels/... next to images/...: e.g. {label_path('x/images/a.jpg')})"
        fixes.append("put the YOLO .txt labels in a labels/ directory parallel to images/")
    elif report.problems:
        found += f", {usable} usable"
    data = {"images": report.images, "labels": report.labels, "usable": usable, "problems": report.problems}
    return Row(f"data.{split}", f"data: {split}", status, found, "; ".join(fixes) or None, details, data)


# ---------------------------------------------------------------------------------------
# 5. data rows, then 6. loader rows


def data_task(opts: Options, kpt_shape=None) -> str:
    """The task the data is checked for: ``--task``, else a directory is classify, ``kpt_shape`` pose."""
    if opts.task:
        return opts.task
    if opts.data is not None and opts.data.is_dir():
        return CLASSIFY
    return POSE if kpt_shape is not None else DETECT


def check_data_and_loader(opts: Options, torch_error: str | None = None) -> Iterator[Row]:
    if opts.data.is_dir() or opts.task == CLASSIFY:
        yield from check_classify_data(opts, torch_error)
        return
    try:
        spec = load_spec(opts.data)
        task = data_task(opts, spec.kpt_shape)
        fmt = label_format(task, spec.kpt_shape)
    except DataError as e:
        yield Row("data.yaml", "data YAML", FAIL, str(e), f"fix {opts.data}")
        yield from _loader_skipped(opts, "the data YAML is unusable")
        return
    nc = len(spec.names)
    how = f"{task} labels" + (": boxes or polygons (--task segment or obb checks for polygons)" if not opts.task and task == DETECT else "")
    yield Row("data.yaml", "data YAML", OK, f"{opts.data} ({nc} classes, root {spec.root}, checked as {how})",
              data={"root": str(spec.root), "names": spec.names, "task": task, "kpt_shape": spec.kpt_shape,
                    "splits": {k: [str(p) for p in v] for k, v in spec.splits.items()}})
    train_ok = False
    threads = min(32, 4 * (opts.cpus or os.cpu_count() or 1))
    for split, entries in spec.splits.items():
        files, missing = image_files(entries)
        if missing:
            yield Row(f"data.{split}", f"data: {split}", FAIL if split in ("train", "val") else WARN,
                      f"path not found: {', '.join(missing)}", "fix the path (relative paths start at 'path:' in the YAML)",
                      data={"missing": missing})
            continue
        if "data" in opts.skip:
            train_ok = train_ok or (split == "train" and bool(files))
            continue
        report = scan_split(files, nc, fmt, threads, _Progress(opts.progress, split, len(files)))
        row = split_row(split, report, nc, fmt)
        if split == "train":
            train_ok = row.status != FAIL or not report.problems.get("special") and row.data["usable"] > 0
        yield row
    yield from _loader_rows(opts, train_ok, {"task": task, "names": spec.names, "channels": spec.channels,
                                             "kpt_shape": spec.kpt_shape,
                                             "train": [str(p) for p in spec.splits["train"]]}, torch_error)


def check_classify_data(opts: Options, torch_error: str | None = None) -> Iterator[Row]:
    """A class-per-folder directory: its classes, then each split's images and class folders."""
    if not opts.data.is_dir():
        yield Row("data.folder", "data folder", FAIL, f"{opts.data} is a file, but a classification data set is a "
                  "directory of class folders (DIR/train/<class>/*.jpg, DIR/val/<class>/*.jpg)",
                  "pass the directory (a dataset YAML is for detect, segment, pose and obb: --task)")
        yield from _loader_skipped(opts, "no classification directory")
        return
    if opts.task and opts.task != CLASSIFY:
        yield Row("data.folder", "data folder", FAIL, f"{opts.data} is a directory: that is classification data, "
                  f"but --task {opts.task} trains on a dataset YAML", f"pass the {opts.task} data set's YAML")
        yield from _loader_skipped(opts, "the data does not fit the task")
        return
    try:
        spec = load_classify_spec(opts.data)
    except DataError as e:
        yield Row("data.folder", "data folder", FAIL, str(e), "lay the images out in class folders")
        yield from _loader_skipped(opts, "the data folder is unusable")
        return
    nc = len(spec.names)
    names = ", ".join(list(spec.names.values())[:8]) + (", ..." if nc > 8 else "")
    found = f"{opts.data}: {_n(nc, 'class')} ({names}), splits {', '.join(spec.splits) or '-'}"
    info = {"root": str(spec.root), "names": spec.names, "task": CLASSIFY, "splits": {k: str(v) for k, v in spec.splits.items()}}
    if spec.auto_split:
        yield Row("data.folder", "data folder", WARN, f"{opts.data}: {_n(nc, 'class folder')}, no train/ folder",
                  f"Ultralytics copies them into {opts.data}_split/train and val (80/20) at every start; "
                  "split them yourself into train/ and val/ to train on stable splits", data=info)
    else:
        yield Row("data.folder", "data folder", OK, found, data=info)
    splits = spec.splits or {"all": spec.root}
    train_ok = False
    threads = min(32, 4 * (opts.cpus or os.cpu_count() or 1))
    for split, folder in splits.items():
        by_class, loose = classify_images(folder)
        files = sorted(f for images in by_class.values() for f in images)
        if "data" in opts.skip:
            train_ok = train_ok or (split in ("train", "all") and bool(files))
            continue
        report = scan_split(files, nc, None, threads, _Progress(opts.progress, split, len(files)))
        train_folders = {d.name for d in splits.get("train", spec.root).iterdir() if d.is_dir()}  # names, or NDJSON ids
        report.problems.update(_class_problems(split, folder, by_class, loose, train_folders))
        row = _classify_split_row(split, report, by_class, nc)
        if split in ("train", "all"):
            train_ok = row.status != FAIL or not report.problems.get("special") and row.data["usable"] > 0
        yield row
    yield from _loader_rows(opts, train_ok, {"task": CLASSIFY, "names": spec.names, "channels": 3,
                                             "train": [str(splits.get("train", spec.root))]}, torch_error)


def _loader_rows(opts: Options, train_ok: bool, data: dict, torch_error: str | None) -> Iterator[Row]:
    """The loader checks after the data rows: skipped when asked, or when the train split cannot feed a loader."""
    if "loader" in opts.skip:
        return
    if not train_ok:
        yield from _loader_skipped(opts, "the train split has no usable images or has files that block")
        return
    yield from check_loader(opts, data, torch_error)


def _class_problems(split: str, folder: Path, by_class: dict, loose: list, names: set) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    if loose:
        problems["loose"] = loose[:MAX_LISTED]
    folders = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
    empty = [f"{folder / d}" for d in folders if d not in by_class]
    if empty and split in ("train", "all"):
        problems["emptyclass"] = empty
    if split not in ("train", "all"):
        extra = [f"{folder / d}" for d in sorted(set(by_class) - names)]
        lacking = sorted(names - set(by_class))
        if extra:
            problems["extraclass"] = extra
        if lacking:
            problems["missingclass"] = [", ".join(lacking[:20]) + (" ..." if len(lacking) > 20 else "")]
    return problems


def _classify_split_row(split: str, report: SplitReport, by_class: dict, nc: int) -> Row:
    status, details = _problem_details(report)
    usable = report.images - sum(report.count(k) for k in _UNUSABLE)
    found = f"{_n(report.images, 'image')} in {_n(len(by_class), 'class folder')}"
    fixes = []
    if report.problems.get("special"):
        fixes.append("remove or replace the non-regular files named above")
    if report.problems.get("corrupt") or report.problems.get("missing"):
        fixes.append("re-export or delete the corrupt images")
    if report.problems.get("loose"):
        fixes.append("move loose images into their class folder")
    if report.problems.get("extraclass") or report.problems.get("missingclass"):
        fixes.append(f"give every split the same class folders as train ({nc} classes)")
    if report.images == 0:
        status = FAIL if split in ("train", "all") else WARN
        found = f"no images in class folders of {split}/"
        fixes = [f"put images in {split}/<class>/ folders"]
    elif usable <= 0:
        status, found = FAIL, found + ", none usable"
    elif report.problems:
        found += f", {usable} usable"
    data = {"images": report.images, "usable": usable, "classes": {k: len(v) for k, v in sorted(by_class.items())},
            "problems": report.problems}
    return Row(f"data.{split}", f"data: {split}", status, found, "; ".join(fixes) or None, details, data)


def _loader_skipped(opts: Options, why: str) -> Iterator[Row]:
    if "loader" not in opts.skip:
        yield Row("loader.single", "DataLoader single", SKIP, f"skipped: {why}")


# ---------------------------------------------------------------------------------------
# DataLoader probe (runs in a subprocess: python -c "...probe_main()" SPEC.json)


def _emit(kind: str, **info) -> None:
    sys.stdout.write(_EVENT + json.dumps(dict(info, event=kind, time=time.time())) + "\n")
    sys.stdout.flush()


def probe_worker_init(worker_id: int) -> None:
    """worker_init_fn of the probe's loader: reports when each worker is up."""
    _emit("worker", id=worker_id, pid=os.getpid())


def probe_main(spec_file: str) -> None:
    """Build Ultralytics' dataset and load a few batches, reporting progress as events."""
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)  # as the training child does, before torch
    spec = json.loads(Path(spec_file).read_text())
    _emit("start")
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
        dataset = ClassificationDataset(spec["train"][0], cfg, augment=True, prefix="train",
                                        **({"names": names} if aligned else {}))
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
            from rocm_yolo.patches import dataloader as patch_module
            from rocm_yolo.profiles import LoaderSettings

            patch_module.install(LoaderSettings(workers=workers, val_workers=None, persistent_workers=False,
                                                prefetch_factor=spec["prefetch"], pin_memory=False, timeout=0))
            patch = "installed"
        except ImportError:
            pass
        _emit("patch", state=patch)
        kwargs = {"multiprocessing_context": "spawn", "prefetch_factor": spec["prefetch"], "worker_init_fn": probe_worker_init}
    loader = torch.utils.data.DataLoader(dataset, batch_size=spec["batch"], shuffle=False, num_workers=workers,
                                         collate_fn=getattr(dataset, "collate_fn", None), **kwargs)
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
                out.append(json.loads(line[len(_EVENT):]))
            except ValueError:
                pass
    return out


def run_probe(opts: Options, spec: dict, build_timeout: float) -> ProbeResult:
    """One probe step; its clock: ``build_timeout`` until the data set is built, then ``opts.timeout``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    code = "import sys; from rocm_yolo.doctor_data import probe_main; probe_main(sys.argv[1])"
    start = time.monotonic()
    proc, out, err = start_captured([opts.python, "-c", code, f.name], dict(os.environ))
    state, deadline, rebased = None, start + build_timeout, False
    try:
        while True:
            try:
                proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            if not rebased and any(e["event"] == "dataset" for e in _events(read_file(out))):
                deadline, rebased = time.monotonic() + opts.timeout, True  # the step's own clock starts now
            if time.monotonic() > deadline:
                state = "timeout"
                break
    finally:
        kill_now(proc)
        os.unlink(f.name)
    events = _events(read_file(out))
    stderr = read_file(err)
    out.close()
    err.close()
    tail = [x for x in stderr.splitlines() if x.strip()][-4:]
    seconds = time.monotonic() - start
    if state == "timeout":
        return ProbeResult("timeout", events, seconds, stderr_tail=tail)
    if any(e["event"] == "done" for e in events):
        return ProbeResult("ok", events, seconds, stderr_tail=tail)
    rc = proc.returncode
    message = tail[-1] if tail else f"exit code {rc}"
    if rc is not None and rc < 0:
        return ProbeResult("crash", events, seconds, f"killed by {signal_name(-rc)}", tail)
    return ProbeResult("error", events, seconds, message, tail)


def check_loader(opts: Options, data: dict, torch_error: str | None = None) -> Iterator[Row]:
    """``data``: the task, names, channels, kpt_shape and train paths the probe builds its dataset from."""
    if torch_error is not None:  # the probe needs torch: its failure would blame the data
        yield from _loader_skipped(opts, f"torch cannot be imported ({torch_error}); see the torch row")
        return
    plan = loader_plan(opts)
    workers = opts.workers if opts.workers is not None else plan["workers"]
    batch = min(opts.batch, 8)
    base = dict(data, names={str(k): v for k, v in data["names"].items()}, imgsz=min(opts.imgsz, 160), batch=batch,
                prefetch=plan["prefetch"] or 2)
    build_timeout = max(opts.timeout, 300.0)
    single = run_probe(opts, dict(base, workers=0, batches=3), build_timeout)
    yield _single_row(opts, single)
    if single.state != "ok":
        reason = "the single-process load failed" if single.state != "timeout" else "the single-process load hung"
        if workers:
            yield Row("loader.multi", "DataLoader spawn", SKIP, f"skipped: {reason}")
        return
    if workers == 0:
        yield Row("loader.multi", "DataLoader spawn", SKIP, "workers=0: no worker processes to test (--workers N to test them)")
        return
    multi = run_probe(opts, dict(base, workers=workers, batches=max(3, 2 * workers)), build_timeout)
    yield from _multi_rows(opts, single, multi, workers)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith(('ch', 'ss')) else 's'}"


def _took(result: ProbeResult, kind: str) -> float | None:
    it, e = result.first("iter"), result.first(kind)
    return None if it is None or e is None else e["time"] - it["time"]


def _single_row(opts: Options, r: ProbeResult) -> Row:
    name, check = "DataLoader single", "loader.single"
    data = {"state": r.state, "seconds": round(r.seconds, 2)}
    if r.state == "ok":
        n, first = len(r.all("batch")), _took(r, "batch")
        shape = r.all("batch")[-1]["shape"] if n else None
        return Row(check, name, OK, f"{_n(n, 'batch')} in the main process, first after {first:.1f} s (batch {shape})", data=data)
    built = r.first("dataset") is not None
    if r.state == "timeout":
        where = "loading batches" if built else "building the data set"
        return Row(check, name, FAIL, f"single-process load hung while {where} (no progress in {opts.timeout:g} s)",
                   "a file blocks reading (see the data rows) or the storage is very slow; copy the data to a local disk",
                   r.stderr_tail, dict(data, verdict="loading hangs even in a single process: the data or its storage is the problem"))
    return Row(check, name, FAIL, f"single-process load failed: {r.message}",
               "fix the data set (see the data rows and the error above)", r.stderr_tail,
               dict(data, verdict="loading fails even in a single process: the data is the problem"))


def _multi_rows(opts: Options, single: ProbeResult, r: ProbeResult, workers: int) -> Iterator[Row]:
    name, check = "DataLoader spawn", "loader.multi"
    up = r.all("worker")
    patch = (r.first("patch") or {}).get("state", "?")
    data = {"state": r.state, "workers": workers, "workers_started": len(up), "patch": patch, "seconds": round(r.seconds, 2)}
    label = f"{workers} spawn worker{'s' if workers > 1 else ''}"
    if r.state == "ok":
        n = len(r.all("batch"))
        yield Row(check, name, OK, f"{label}: {_n(n, 'batch')}", data=data)
    elif r.state == "timeout":
        started = f"{len(up)}/{workers} workers started, " if r.first("iter") else ""
        got = len(r.all("batch"))
        yield Row(check, name, FAIL, f"{label}: {started}{_n(got, 'batch')}, then no progress for {opts.timeout:g} s (hang)",
                  "train with --profile single (no worker processes); --profile safe may also get through",
                  r.stderr_tail, dict(data, verdict="single-process works, multi-process hangs: use --profile single"))
    else:
        shm = " (/dev/shm too small? see the shared memory row)" if "bus error" in (r.message or "").lower() else ""
        yield Row(check, name, FAIL, f"{label}: {r.state}: {r.message}{shm}",
                  "train with --profile single (no worker processes)", r.stderr_tail,
                  dict(data, verdict="single-process works, multi-process crashes: use --profile single"))
    if up and r.first("iter"):
        startup = max(e["time"] for e in up) - r.first("iter")["time"]
        first = _took(r, "batch")
        found = f"{len(up)} workers up after {startup:.1f} s" + (f", first batch after {first:.1f} s" if first else "")
        status = WARN if startup > 60 else OK
        yield Row("loader.startup", "worker start-up", status, found,
                  "slow start-up: each spawned worker imports torch; fewer --workers start faster" if status == WARN else None,
                  data={"startup": round(startup, 2), "first_batch": first and round(first, 2)})
    else:
        yield Row("loader.startup", "worker start-up", SKIP, "no worker reported start-up")
