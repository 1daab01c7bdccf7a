"""The doctor's data set checks: every image decoded, every label line checked against the task's format.

Each task's data is read the way Ultralytics reads it (:mod:`rocm_yolo.ultralytics_rules`: a
dataset YAML with YOLO label files for detect, segment, pose and obb; a class-per-folder
directory for classify), then every image is decoded and every label line checked, in a
thread pool (OpenCV releases the GIL). A FIFO, socket or device file is reported and never
opened: opening it would block, which is how such a file hangs a training run. The task is
``--task``, else what the data says: a directory is classify, a YAML with ``kpt_shape``
pose, any other YAML detect (whose lines may be boxes or polygons). The DataLoader rows
that follow are :mod:`.loader_probe`'s.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rocm_yolo.doctor.loader_probe import check_loader, loader_skipped
from rocm_yolo.doctor.options import Options
from rocm_yolo.doctor.report import FAIL, OK, WARN, Row, plural
from rocm_yolo.ultralytics_rules.data.classify import classify_images, load_classify_spec
from rocm_yolo.ultralytics_rules.data.datasets import DataError, detection_layout, image_files, label_path, load_spec
from rocm_yolo.ultralytics_rules.data.labels import LabelFormat, check_image, check_label, label_format
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY, DETECT, POSE

SHOW = 5  # file names shown per problem in the table (all of them go into --json, up to MAX_LISTED)
MAX_LISTED = 1000


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
                sys.stderr.write(
                    f"\r  checking {self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                )
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
        details += [f"  {x}" for x in items[:SHOW]] + (
            [f"  ... and {len(items) - SHOW} more (--json lists them)"] if len(items) > SHOW else []
        )
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
        fixes.append(
            f"fix the label lines named above: {fmt.task} lines have {fmt.expected()} numbers, "
            "coordinates normalized to 0..1"
        )
    if report.problems.get("boxrow"):
        fixes.append(
            f"give every object of a {fmt.task} data set a polygon (class x1 y1 x2 y2 ...), "
            "or train a detection model on it"
        )
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
        yield from loader_skipped(opts, "the data YAML is unusable")
        return
    nc = len(spec.names)
    how = f"{task} labels" + (
        ": boxes or polygons (--task segment or obb checks for polygons)" if not opts.task and task == DETECT else ""
    )
    yield Row(
        "data.yaml",
        "data YAML",
        OK,
        f"{opts.data} ({nc} classes, root {spec.root}, checked as {how})",
        data={
            "root": str(spec.root),
            "names": spec.names,
            "task": task,
            "kpt_shape": spec.kpt_shape,
            "splits": {k: [str(p) for p in v] for k, v in spec.splits.items()},
        },
    )
    train_ok = False
    threads = min(32, 4 * (opts.cpus or os.cpu_count() or 1))
    for split, entries in spec.splits.items():
        files, missing = image_files(entries)
        if missing:
            yield Row(
                f"data.{split}",
                f"data: {split}",
                FAIL if split in ("train", "val") else WARN,
                f"path not found: {', '.join(missing)}",
                "fix the path (relative paths start at 'path:' in the YAML)",
                data={"missing": missing},
            )
            continue
        if "data" in opts.skip:
            train_ok = train_ok or (split == "train" and bool(files))
            continue
        report = scan_split(files, nc, fmt, threads, _Progress(opts.progress, split, len(files)))
        row = split_row(split, report, nc, fmt)
        if split == "train":
            train_ok = row.status != FAIL or not report.problems.get("special") and row.data["usable"] > 0
        yield row
    yield from _loader_rows(
        opts,
        train_ok,
        {
            "task": task,
            "names": spec.names,
            "channels": spec.channels,
            "kpt_shape": spec.kpt_shape,
            "train": [str(p) for p in spec.splits["train"]],
        },
        torch_error,
    )


def _not_classification(opts: Options) -> tuple[Row, str] | None:
    """The row of a DATA that is no classification set (a file; a directory for another task, or laid out for
    detection), and why the loader test is skipped; None for a directory to check."""
    if not opts.data.is_dir():
        row = Row(
            "data.folder",
            "data folder",
            FAIL,
            f"{opts.data} is a file, but a classification data set is a "
            "directory of class folders (DIR/train/<class>/*.jpg, DIR/val/<class>/*.jpg)",
            "pass the directory (a dataset YAML is for detect, segment, pose and obb: --task)",
        )
        return row, "no classification directory"
    if opts.task and opts.task != CLASSIFY:
        row = Row(
            "data.folder",
            "data folder",
            FAIL,
            f"{opts.data} is a directory: that is classification data, but --task {opts.task} trains on a dataset YAML",
            f"pass the {opts.task} data set's YAML",
        )
        return row, "the data does not fit the task"
    if detection_layout(opts.data):
        row = Row(
            "data.folder",
            "data folder",
            FAIL,
            f"{opts.data} is laid out for detection (images/ beside labels/), not in classification's class folders",
            f"write a dataset YAML that points at it (path: {opts.data.absolute()}, train: images/train, val: "
            "images/val, names: {0: ...}) and pass it",
        )
        return row, "the data is no classification set"
    return None


def check_classify_data(opts: Options, torch_error: str | None = None) -> Iterator[Row]:
    """A class-per-folder directory: its classes, then each split's images and class folders."""
    wrong = _not_classification(opts)
    if wrong is not None:
        yield wrong[0]
        yield from loader_skipped(opts, wrong[1])
        return
    try:
        spec = load_classify_spec(opts.data)
    except DataError as e:
        yield Row("data.folder", "data folder", FAIL, str(e), "lay the images out in class folders")
        yield from loader_skipped(opts, "the data folder is unusable")
        return
    nc = len(spec.names)
    names = ", ".join(list(spec.names.values())[:8]) + (", ..." if nc > 8 else "")
    found = f"{opts.data}: {plural(nc, 'class')} ({names}), splits {', '.join(spec.splits) or '-'}"
    info = {
        "root": str(spec.root),
        "names": spec.names,
        "task": CLASSIFY,
        "splits": {k: str(v) for k, v in spec.splits.items()},
    }
    if spec.auto_split:
        yield Row(
            "data.folder",
            "data folder",
            WARN,
            f"{opts.data}: {plural(nc, 'class folder')}, no train/ folder",
            f"Ultralytics copies them into {opts.data}_split/train and val (80/20) at every start; "
            "split them yourself into train/ and val/ to train on stable splits",
            data=info,
        )
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
    yield from _loader_rows(
        opts,
        train_ok,
        {"task": CLASSIFY, "names": spec.names, "channels": 3, "train": [str(splits.get("train", spec.root))]},
        torch_error,
    )


def _loader_rows(opts: Options, train_ok: bool, data: dict, torch_error: str | None) -> Iterator[Row]:
    """The loader checks after the data rows: skipped when asked, or when the train split cannot feed a loader."""
    if "loader" in opts.skip:
        return
    if not train_ok:
        yield from loader_skipped(opts, "the train split has no usable images or has files that block")
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
    found = f"{plural(report.images, 'image')} in {plural(len(by_class), 'class folder')}"
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
    data = {
        "images": report.images,
        "usable": usable,
        "classes": {k: len(v) for k, v in sorted(by_class.items())},
        "problems": report.problems,
    }
    return Row(f"data.{split}", f"data: {split}", status, found, "; ".join(fixes) or None, details, data)
