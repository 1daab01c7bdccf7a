"""The doctor's data set and DataLoader checks.

Data: the YAML is resolved the way Ultralytics resolves it (``path:`` root, train/val/test
entries that are directories, ``.txt`` image lists or lists of either; images/… ↔ labels/…),
then every image is decoded and every label line checked, in a thread pool (OpenCV
releases the GIL). A FIFO, socket or device file is reported and never opened: opening it
would block, which is how such a file hangs a training run.

DataLoader: Ultralytics' own ``build_yolo_dataset`` and a torch DataLoader, in a
subprocess per step (single process, then spawn workers), each killed with its whole
process group when it overruns; the verdict is what a person would conclude.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rocm_yolo.doctor_model import FAIL, OK, SKIP, WARN, Options, Row, loader_plan
from rocm_yolo.proctree import kill_now, read_file, signal_name, start_captured

# Ultralytics' ultralytics.data.utils.IMG_FORMATS (8.4), copied: importing it imports torch.
IMG_FORMATS = {"avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp"}
NO_CV2_DECODE = {"avif", "heic", "heif"}  # Ultralytics opens these through Pillow plugins
SHOW = 5  # file names shown per problem in the table (all of them go into --json, up to MAX_LISTED)
MAX_LISTED = 1000
_EVENT = "@@doctor "


class DataError(Exception):
    """The YAML cannot be used at all (one line for the row)."""


@dataclass
class DataSpec:
    yaml: Path
    root: Path
    names: dict[int, str]
    splits: dict[str, list[Path]]  # split -> resolved entries (dirs, txt lists, files)
    kpt_shape: list | None = None
    channels: int = 3


# ---------------------------------------------------------------------------------------
# YAML -> paths -> image files, like Ultralytics


def _datasets_dir() -> Path | None:
    """Ultralytics' ``datasets_dir`` setting, read from its settings file without importing it."""
    base = os.environ.get("YOLO_CONFIG_DIR") or os.path.join(Path.home(), ".config", "Ultralytics")
    try:
        return Path(json.loads((Path(base) / "settings.json").read_text())["datasets_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_spec(yaml_path: Path) -> DataSpec:
    import yaml

    try:
        data = yaml.safe_load(yaml_path.read_text(errors="replace"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DataError(f"{yaml_path.name} is not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise DataError(f"{yaml_path.name} is not a mapping of keys (train:, val:, names:)")
    names = data.get("names")
    if isinstance(names, list):
        names = dict(enumerate(names))
    elif isinstance(names, dict):
        try:
            names = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            raise DataError("names: keys must be class numbers 0, 1, ...") from None
    elif names is None and isinstance(data.get("nc"), int):
        names = {i: f"class{i}" for i in range(data["nc"])}
    else:
        raise DataError(f"{yaml_path.name} has no 'names' list (or 'nc')")
    if not names:
        raise DataError("names: is empty")
    if "nc" in data and data["nc"] != len(names):
        raise DataError(f"nc: {data['nc']} but names has {len(names)} entries")
    for key in ("train", "val"):
        if not data.get(key):
            raise DataError(f"{yaml_path.name} has no '{key}:' entry")
    root = Path(data.get("path") or yaml_path.parent)
    if root.is_file():
        raise DataError(f"path: {root} is a file: it must be the data set's root directory (or leave it out)")
    if not root.exists() and not root.is_absolute():
        # Ultralytics resolves a relative root against the working directory, then its datasets_dir
        alt = (_datasets_dir() or Path("datasets")) / root
        root = (yaml_path.parent / root) if (yaml_path.parent / root).exists() and not alt.exists() else alt
    splits: dict[str, list[Path]] = {}
    for key in ("train", "val", "test"):
        value = data.get(key)
        if not value:
            continue
        entries = value if isinstance(value, list) else [value]
        resolved = []
        for entry in entries:
            x = (root / str(entry)).resolve()
            if not x.exists() and str(entry).startswith("../"):
                x = (root / str(entry)[3:]).resolve()
            resolved.append(x)
        splits[key] = resolved
    return DataSpec(yaml_path, root, names, splits, data.get("kpt_shape"), int(data.get("channels", 3) or 3))


def image_files(entries: list[Path]) -> tuple[list[str], list[str]]:
    """(image files, missing entries) of one split, as Ultralytics' ``get_img_files`` lists them."""
    import glob

    files, missing = [], []
    for p in entries:
        if p.is_dir():
            files += glob.glob(str(Path(glob.escape(str(p))) / "**" / "*.*"), recursive=True)
        elif p.is_file():
            parent = str(p.parent) + os.sep
            lines = p.read_text(errors="replace").strip().splitlines()
            files += [x.replace("./", parent, 1) if x.startswith("./") else x for x in (y.strip() for y in lines) if x]
        else:
            missing.append(str(p))
    return sorted(x for x in files if x.rpartition(".")[-1].lower() in IMG_FORMATS), missing


def label_path(image: str) -> str:
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


# ---------------------------------------------------------------------------------------
# one image + its label


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"


def check_image(path: str) -> tuple[str, str] | None:
    """None if the image decodes; else (problem, message). Never opens a non-regular file."""
    try:
        st = os.stat(path)
    except OSError as e:
        return "missing", f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "special", f"{path}: a {_kind(st.st_mode)}, not a regular file (reading it would block)"
    ext = path.rpartition(".")[-1].lower()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        return "corrupt", f"{path}: unreadable ({e.strerror})"
    if not raw:
        return "corrupt", f"{path}: empty file"
    if ext in NO_CV2_DECODE:
        return None
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        return "corrupt", f"{path}: does not decode as an image"
    if img.shape[0] < 10 or img.shape[1] < 10:
        return "corrupt", f"{path}: {img.shape[1]}x{img.shape[0]} px (Ultralytics needs >= 10 px)"
    if ext in ("jpg", "jpeg") and raw[-2:] != b"\xff\xd9":
        return "truncated", f"{path}: truncated JPEG (Ultralytics restores it on the fly)"
    return None


def check_label(path: str, nc: int, columns: set[int] | None) -> tuple[str, str] | None:
    """None if the label file is fine or absent-as-background; else (problem, message)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "nolabel", path
    except OSError as e:
        return "badlabel", f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "special", f"{path}: a {_kind(st.st_mode)}, not a regular file (reading it would block)"
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return "badlabel", f"{path}: unreadable ({e.strerror})"
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            values = [float(x) for x in parts]
        except ValueError:
            return "badlabel", f"{path}:{n}: not numbers: {line.strip()[:60]!r}"
        k = len(values)
        ok_columns = (k in columns) if columns else (k == 5 or (k >= 7 and k % 2 == 1))
        if not ok_columns:
            want = " or ".join(map(str, sorted(columns))) if columns else "5 (class x y w h) or a polygon"
            return "badlabel", f"{path}:{n}: {k} numbers, expected {want}"
        cls = values[0]
        if cls != int(cls) or cls < 0:
            return "badclass", f"{path}:{n}: class id {parts[0]} is not a whole number >= 0"
        if cls >= nc:
            return "badclass", f"{path}:{n}: class id {int(cls)} out of range (names has {nc}: 0-{nc - 1})"
        coords = values[1:5] if columns else values[1:]
        if max(coords) > 1.01 or min(coords) < -0.01:
            return "badlabel", f"{path}:{n}: coordinates outside 0..1 ({' '.join(parts[1:5])}): not normalized?"
    return None


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


def scan_split(files: list[str], nc: int, columns: set[int] | None, threads: int, progress: _Progress) -> SplitReport:
    report = SplitReport(images=len(files))

    def one(path: str):
        result = check_image(path), check_label(label_path(path), nc, columns)
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
    ("missing", "listed but missing", False),
    ("corrupt", "corrupt images (Ultralytics skips them)", False),
    ("badlabel", "malformed label files (Ultralytics skips those images)", False),
    ("badclass", "labels with class ids out of range of names (Ultralytics skips those images)", False),
    ("truncated", "truncated JPEGs", False),
)


def split_row(split: str, report: SplitReport, nc: int) -> Row:
    details, fixes, status = [], [], OK
    usable = report.images - sum(report.count(k) for k in ("special", "missing", "corrupt", "badlabel", "badclass"))
    for kind, what, blocks in _PROBLEMS:
        items = report.problems.get(kind, [])
        if not items:
            continue
        status = FAIL if blocks else (WARN if status == OK else status)
        details.append(f"{len(items)} {what}:")
        details += [f"  {x}" for x in items[:SHOW]] + ([f"  ... and {len(items) - SHOW} more (--json lists them)"]
                                                      if len(items) > SHOW else [])
    if report.problems.get("special"):
        fixes.append("remove or replace the non-regular files named above")
    if report.problems.get("corrupt") or report.problems.get("missing"):
        fixes.append("re-export or delete the corrupt/missing images")
    if report.problems.get("badclass"):
        fixes.append(f"fix the class ids or complete 'names' ({nc} classes) in the YAML")
    if report.problems.get("badlabel"):
        fixes.append("fix the label lines named above: 'class x_center y_center width height', normalized to 0..1")
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


def check_data_and_loader(opts: Options, torch_error: str | None = None) -> Iterator[Row]:
    try:
        spec = load_spec(opts.data)
    except DataError as e:
        yield Row("data.yaml", "data YAML", FAIL, str(e), f"fix {opts.data}")
        yield from _loader_skipped(opts, "the data YAML is unusable")
        return
    nc = len(spec.names)
    yield Row("data.yaml", "data YAML", OK, f"{opts.data} ({nc} classes, root {spec.root})",
              data={"root": str(spec.root), "names": spec.names, "splits": {k: [str(p) for p in v] for k, v in spec.splits.items()}})
    columns = None
    if spec.kpt_shape:
        k, dims = int(spec.kpt_shape[0]), int(spec.kpt_shape[1]) if len(spec.kpt_shape) > 1 else 2
        columns = {5 + k * dims}
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
        report = scan_split(files, nc, columns, threads, _Progress(opts.progress, split, len(files)))
        row = split_row(split, report, nc)
        if split == "train":
            train_ok = row.status != FAIL or not report.problems.get("special") and row.data["usable"] > 0
        yield row
    if "loader" in opts.skip:
        return
    if torch_error is not None:  # the loader test needs torch: its failure would blame the data
        yield from _loader_skipped(opts, f"torch cannot be imported ({torch_error}); see the torch row")
        return
    if not train_ok:
        yield from _loader_skipped(opts, "the train split has no usable images or has files that block")
        return
    yield from check_loader(opts, spec)


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

    cfg = get_cfg(overrides={"imgsz": spec["imgsz"], "task": "detect"})
    data = {"names": {int(k): v for k, v in spec["names"].items()}, "nc": len(spec["names"]), "channels": spec["channels"]}
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


def check_loader(opts: Options, spec: DataSpec) -> Iterator[Row]:
    plan = loader_plan(opts)
    workers = opts.workers if opts.workers is not None else plan["workers"]
    batch = min(opts.batch, 8)
    base = {"names": {str(k): v for k, v in spec.names.items()}, "channels": spec.channels,
            "train": [str(p) for p in spec.splits["train"]], "imgsz": min(opts.imgsz, 160), "batch": batch,
            "prefetch": plan["prefetch"] or 2}
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
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith('ch') else 's'}"


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
