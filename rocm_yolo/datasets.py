"""Each Ultralytics task's data, found and checked the way Ultralytics reads it, without importing it.

Two readers, one per kind of data set:

- a dataset YAML (detect, segment, pose, obb): :func:`load_spec` resolves it like
  ``check_det_dataset`` (``path:`` root, train/val/test entries that are directories, ``.txt``
  image lists or lists of either; images/... -> labels/...), and :func:`check_label` checks
  one label file line by line with the rules of ``verify_image_label`` for the task
  (:class:`LabelFormat`): boxes, polygons (segment), keypoints against ``kpt_shape`` (pose),
  corner points (obb). A problem names its file and line;
- a class-per-folder directory (classify): :func:`load_classify_spec` mirrors
  ``check_cls_dataset`` (``train/<class>/``, ``val/`` or ``validation/``/``valid/``/``test/``,
  class names from the train folders, the 80/20 split Ultralytics makes of a directory
  without ``train/``).

The CLI runs :func:`check_for_training` before anything starts: the structure, and a sample
of labels or images (a full scan of a large set is the doctor's job, see
:mod:`rocm_yolo.doctor_data`, which checks every file with the same functions).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Iterator

from rocm_yolo.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

# Ultralytics' ultralytics.data.utils.IMG_FORMATS (8.4), copied: importing it imports torch.
IMG_FORMATS = {"avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp"}
NO_CV2_DECODE = {"avif", "heic", "heif"}  # Ultralytics opens these through Pillow plugins
LABEL_TASKS = (DETECT, SEGMENT, POSE, OBB)  # tasks whose labels are YOLO .txt lines
SAMPLE = 32  # label files (or images) per split the CLI checks before a run
ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".xz", ".bz2", ".txz", ".tbz2")  # check_cls_dataset unpacks these


class DataError(Exception):
    """The data cannot be used at all (one line)."""


# ---------------------------------------------------------------------------------------
# dataset YAML -> paths -> image files, like check_det_dataset


@dataclass
class DataSpec:
    yaml: Path
    root: Path
    names: dict[int, str]
    splits: dict[str, list[Path]]  # split -> resolved entries (dirs, txt lists, files)
    kpt_shape: list | None = None
    channels: int = 3


def settings_files(env=os.environ) -> list[Path]:
    """Where Ultralytics keeps ``settings.json`` on Linux, in its order (``get_user_config_dir``).

    ``$YOLO_CONFIG_DIR/Ultralytics``, else ``$XDG_CONFIG_HOME/Ultralytics``, else
    ``~/.config/Ultralytics``; where that cannot be created, ``$TMPDIR/Ultralytics-UID`` (8.4.190)
    or ``/tmp/Ultralytics`` (8.4.158).
    """
    if env.get("YOLO_CONFIG_DIR"):
        first = Path(env["YOLO_CONFIG_DIR"]).expanduser() / "Ultralytics"
    else:
        first = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "Ultralytics"
    fallbacks = [Path(tempfile.gettempdir()) / f"Ultralytics-{os.getuid()}", Path("/tmp") / "Ultralytics"]
    return [base / "settings.json" for base in (first, *fallbacks)]


def datasets_dir(env=os.environ) -> Path | None:
    """Ultralytics' ``datasets_dir`` setting, read from its settings file without importing it."""
    for path in settings_files(env):
        try:
            return Path(json.loads(path.read_text())["datasets_dir"])
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError):
            return None
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
        alt = (datasets_dir() or Path("datasets")) / root
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


def _is_image(name: str) -> bool:
    return name.rpartition(".")[-1].lower() in IMG_FORMATS


def image_files(entries: list[Path]) -> tuple[list[str], list[str]]:
    """(image files, missing entries) of one split, as Ultralytics' ``get_img_files`` lists them."""
    import glob

    files, missing = [], []
    for p in entries:
        if p.is_dir():
            files += glob.glob(str(Path(glob.escape(str(p))) / "**" / "*.*"), recursive=True)
        elif p.is_file():
            files += _listed(p)
        else:
            missing.append(str(p))
    return sorted(x for x in files if _is_image(x)), missing


def _listed(txt: Path) -> list[str]:
    parent = str(txt.parent) + os.sep
    lines = txt.read_text(errors="replace").strip().splitlines()
    return [x.replace("./", parent, 1) if x.startswith("./") else x for x in (y.strip() for y in lines) if x]


def _walk_images(folder: Path) -> Iterator[str]:
    """Image files under ``folder``, lazily, in a stable order (a sample need not list everything)."""
    for top, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if _is_image(name):
                yield os.path.join(top, name)


def sample_images(entries: list[Path], count: int) -> list[str]:
    """The first ``count`` image files of a split, without listing all of it; [] if a path is missing."""
    found: list[str] = []
    for p in entries:
        if p.is_dir():
            found += islice(_walk_images(p), count - len(found))
        elif p.is_file():
            found += [x for x in _listed(p) if _is_image(x)][: count - len(found)]
        if len(found) >= count:
            break
    return found


def label_path(image: str) -> str:
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


# ---------------------------------------------------------------------------------------
# one image


def file_kind(mode: int) -> str:
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
        return "special", f"{path}: a {file_kind(st.st_mode)}, not a regular file (reading it would block)"
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


# ---------------------------------------------------------------------------------------
# label lines, per task (ultralytics.data.utils.verify_image_label)


def kpt_shape_problem(kpt_shape) -> str | None:
    """Why ``kpt_shape`` is unusable (Ultralytics: [keypoints > 0, dims 2 or 3]), or None."""
    ok = (isinstance(kpt_shape, (list, tuple)) and len(kpt_shape) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in kpt_shape)
          and kpt_shape[0] > 0 and kpt_shape[1] in (2, 3))
    return None if ok else (f"kpt_shape: {kpt_shape} is not [keypoints, dims] with keypoints > 0 and dims 2 (x y) "
                            "or 3 (x y visible), e.g. kpt_shape: [17, 3]")


@dataclass(frozen=True)
class LabelFormat:
    """What a label line of ``task`` looks like. ``nkpt``/``ndim`` come from the YAML's
    ``kpt_shape``; for a task other than pose, Ultralytics drops the keypoints of such lines."""

    task: str = DETECT
    nkpt: int = 0
    ndim: int = 0

    @property
    def pose_columns(self) -> int:
        return 5 + self.nkpt * self.ndim

    def expected(self) -> str:
        if self.task == POSE:
            return (f"{self.pose_columns} (class x y w h, then {self.nkpt} keypoints of {self.ndim} values, "
                    f"as kpt_shape [{self.nkpt}, {self.ndim}] says)")
        if self.task == OBB:
            return "9 (class x1 y1 x2 y2 x3 y3 x4 y4: the 4 corner points)"
        if self.task == SEGMENT:
            return "a polygon (class x1 y1 x2 y2 x3 y3 ...: 3 points or more)"
        return "5 (class x y w h) or a polygon (class x1 y1 x2 y2 x3 y3 ...)"


def label_format(task: str, kpt_shape=None) -> LabelFormat:
    """The label format of ``task`` with the YAML's ``kpt_shape``; DataError when pose lacks a usable one."""
    if kpt_shape is not None or task == POSE:
        problem = "no 'kpt_shape:' (e.g. kpt_shape: [17, 3]): pose labels need it" if kpt_shape is None else \
            kpt_shape_problem(kpt_shape)
        if problem:
            raise DataError(problem)
        return LabelFormat(task, int(kpt_shape[0]), int(kpt_shape[1]))
    return LabelFormat(task)


def _check_values(values: list[float], shape: str, fmt: LabelFormat, nc: int) -> tuple[str, str] | None:
    """Class id and coordinate rules of ``verify_image_label`` for one parsed line."""
    cls = values[0]
    if cls != int(cls) or cls < 0:
        return "badclass", f"class id {cls:g} is not a whole number >= 0"
    if cls >= nc:
        return "badclass", f"class id {int(cls)} out of range (names has {nc}: 0-{nc - 1})"
    if shape == "box":
        points, box = values[1:5], values[1:5]
    elif shape == "polygon":  # checked point by point (Ultralytics checks the polygon's box)
        points, box = values[1:], None
    else:  # pose: the box, then each keypoint's x y (its visibility is not a coordinate)
        kpts = values[5:]
        points = values[1:5] + [v for i, v in enumerate(kpts) if i % fmt.ndim < 2]
        box = values[1:5]
    if max(points) > 1.01:
        return "badlabel", f"coordinates outside 0..1 (up to {max(points):g}): not normalized?"
    low = min(values[1:])
    if low < 0 and (low < -0.01 or (box is not None and min(box[2:4]) < 0)):
        return "badlabel", f"negative values ({low:g})"
    return None


def _shape_of(k: int, fmt: LabelFormat) -> str | None:
    """'box', 'polygon' or 'pose' for a line of ``k`` numbers; None when the task takes no such line."""
    if fmt.task == POSE:
        return "pose" if k == fmt.pose_columns else None
    if k == 5:
        return "box"
    if k > 6 and k % 2 == 1:  # class + x y pairs, 3 points or more
        return "polygon"
    return None


def check_label(path: str, nc: int, fmt: LabelFormat = LabelFormat()) -> tuple[str, str] | None:
    """None if the label file is fine; else (problem, "FILE:LINE: what is wrong").

    Problems: ``nolabel`` (no file: a background image), ``special`` (a FIFO or device:
    reading it blocks), ``badlabel`` and ``badclass`` (Ultralytics skips the image), ``boxrow``
    (a box line where segment/obb need polygons: Ultralytics refuses the whole data set).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "nolabel", path
    except OSError as e:
        return "badlabel", f"{path}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "special", f"{path}: a {file_kind(st.st_mode)}, not a regular file (reading it would block)"
    try:
        text = Path(path).read_text(encoding="utf-8-sig", errors="replace")  # Ultralytics strips a BOM
    except OSError as e:
        return "badlabel", f"{path}: unreadable ({e.strerror})"
    shapes: list[tuple[int, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            values = [float(x) for x in parts]
        except ValueError:
            return "badlabel", f"{path}:{n}: not numbers: {line.strip()[:60]!r}"
        if not all(math.isfinite(v) for v in values):
            return "badlabel", f"{path}:{n}: not finite numbers: {line.strip()[:60]!r}"
        if fmt.task != POSE and fmt.nkpt and len(values) == fmt.pose_columns:
            values = values[:5]  # pose labels for a box task: Ultralytics keeps the box
        shape = _shape_of(len(values), fmt)
        if shape is None:
            return "badlabel", f"{path}:{n}: {len(values)} numbers, expected {fmt.expected()}"
        problem = _check_values(values, shape, fmt, nc)
        if problem:
            return problem[0], f"{path}:{n}: {problem[1]}"
        shapes.append((n, shape))
    first = shapes[0][1] if shapes else None
    other = next((n for n, s in shapes if s != first), None)
    if other is not None:
        return "badlabel", f"{path}:{other}: mixes box and polygon lines (Ultralytics skips the image)"
    if first == "box" and fmt.task in (SEGMENT, OBB):
        return "boxrow", (f"{path}:{shapes[0][0]}: a box (class x y w h) where {fmt.task} needs {fmt.expected()}: "
                          f"Ultralytics refuses a {fmt.task} data set with box-only label files "
                          "(releases before 8.4.84 dropped every polygon instead)")
    return None


# ---------------------------------------------------------------------------------------
# classification: a class-per-folder directory (ultralytics.data.utils.check_cls_dataset)


@dataclass(frozen=True)
class ClassifySpec:
    root: Path
    names: dict[int, str]
    splits: dict[str, Path] = field(default_factory=dict)  # train, val (val/validation/valid), test
    auto_split: bool = False  # no train/: Ultralytics splits ROOT into ROOT_split/{train,val} first


def first_images(folder: Path, count: int) -> list[str]:
    """Up to ``count`` images under ``folder``, in directory order, stopping as soon as they are found
    (a thousand ImageNet class folders cost a thousand short reads, not a listing of every file)."""
    found: list[str] = []
    pending, seen = [str(folder)], set()
    while pending and len(found) < count:
        try:
            top = pending.pop()
            st = os.stat(top)
            if (st.st_dev, st.st_ino) in seen:  # a symlink loop
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(top) as entries:
                for entry in entries:
                    if entry.is_dir():
                        pending.append(entry.path)
                    elif _is_image(entry.name):
                        found.append(entry.path)
                        if len(found) >= count:
                            break
        except OSError:
            continue
    return found


def load_classify_spec(path: Path) -> ClassifySpec:
    """The folders and classes Ultralytics will train on; DataError when it would refuse them."""
    import yaml

    layout = f"{path}/train/<class>/*.jpg and {path}/val/<class>/*.jpg"
    if not path.is_dir():
        raise DataError(f"{path} is not a directory: a classification data set is a folder laid out as {layout}")
    train = path / "train"
    if not train.is_dir():
        classes = sorted(d.name for d in path.iterdir() if d.is_dir() and first_images(d, 1))
        if not classes:
            raise DataError(f"{path} has no train/ folder and no class folders with images: lay it out as {layout}")
        return ClassifySpec(path, dict(enumerate(classes)), auto_split=True)
    val = next((path / n for n in ("val", "validation", "valid") if (path / n).exists()), None)
    test = path / "test" if (path / "test").exists() else None
    ndjson = path / ".ndjson.yaml"
    if ndjson.is_file():
        try:
            names = yaml.safe_load(ndjson.read_text())["names"]
            names = dict(enumerate(names)) if isinstance(names, list) else dict(names)
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            raise DataError(f"{ndjson} has no readable 'names:'") from None
    else:
        names = dict(enumerate(sorted(d.name for d in train.iterdir() if d.is_dir())))
    if not names:
        raise DataError(f"{train} has no class folders: put each class's images in {train}/<class>/")
    if val is None and test is None:
        raise DataError(f"{path} has no val/ folder (nor validation/, valid/ or test/), which Ultralytics validates on: "
                        f"put some images of each class in {path}/val/<class>/")
    splits = {"train": train, **({"val": val} if val else {}), **({"test": test} if test else {})}
    return ClassifySpec(path, names, splits)


def classify_images(split_dir: Path) -> tuple[dict[str, list[str]], list[str]]:
    """(class folder -> its images, images directly in ``split_dir``, which ImageFolder ignores)."""
    by_class: dict[str, list[str]] = {}
    loose: list[str] = []
    for image in _walk_images(split_dir):
        rel = Path(image).relative_to(split_dir)
        if len(rel.parts) == 1:
            loose.append(image)
        else:
            by_class.setdefault(rel.parts[0], []).append(image)
    return by_class, loose


# ---------------------------------------------------------------------------------------
# the CLI's check before a run


def check_for_training(data: Path, task: str) -> list[str]:
    """Check ``data`` for ``task`` before a run: the structure, and a sample of labels (or images).

    Raises DataError for data Ultralytics would refuse (or that would train on nothing);
    returns notes for the run header (problems Ultralytics gets past by skipping images).
    """
    if task == CLASSIFY:
        return _check_classify(data)
    spec = load_spec(data)
    if task not in LABEL_TASKS:
        return []  # semantic, depth: their masks and depth maps are not checked here
    fmt = label_format(task, spec.kpt_shape)
    nc = len(spec.names)
    notes = []
    for split in ("train", "val"):
        files = sample_images(spec.splits.get(split, []), SAMPLE)
        found = [(f, check_label(label_path(f), nc, fmt)) for f in files]
        labelled = [(f, p) for f, p in found if not (p and p[0] == "nolabel")]
        problems = [p for _, p in labelled if p]
        fatal = next((p for p in problems if p[0] in ("boxrow", "special")), None)
        if fatal:
            raise DataError(fatal[1])
        if problems and len(problems) == len(labelled):
            raise DataError(f"{problems[0][1]}; each of the first {len(labelled)} {split} label files has such a "
                            f"problem (a {task} label line has {fmt.expected()} numbers)")
        if problems:
            notes.append(f"data: {len(problems)} of the first {len(labelled)} {split} label files have problems "
                         f"Ultralytics skips the image for, e.g. {problems[0][1]} "
                         f"('rocm-yolo doctor {data} --task {task}' checks every file)")
        if files and not labelled and split == "train":
            notes.append(f"data: none of the first {len(files)} train images has a label file (e.g. "
                         f"{label_path(files[0])}): Ultralytics trains on them as backgrounds")
    return notes


def _check_classify(path: Path) -> list[str]:
    spec = load_classify_spec(path)
    names = ", ".join(list(spec.names.values())[:10]) + (", ..." if len(spec.names) > 10 else "")
    count = len(spec.names)
    notes = [f"data: classification, {count} class{'' if count == 1 else 'es'} ({names})"]
    if spec.auto_split:
        notes.append(f"data: {path} has no train/ folder: Ultralytics first copies its class folders into "
                     f"{path}_split/train and val (80/20) and trains on that")
        return notes
    train = spec.splits["train"]
    folders = sorted(d.name for d in train.iterdir() if d.is_dir())  # the class names, or ids for an NDJSON set
    per_class = {name: first_images(train / name, 2) for name in folders}
    if not any(per_class.values()):
        raise DataError(f"no training images in {train}/<class>/ (jpg, png, ...)")
    empty = [name for name, files in per_class.items() if not files]
    if empty:
        notes.append(f"data: {len(empty)} class folder(s) in {train} have no images: {', '.join(empty[:5])}")
    sample = [f for files in per_class.values() for f in files][:SAMPLE]
    problems = [p for p in map(check_image, sample) if p and p[0] != "truncated"]
    fatal = next((p for p in problems if p[0] == "special"), None)
    if fatal:
        raise DataError(fatal[1])
    if problems and len(problems) == len(sample):
        raise DataError(f"{problems[0][1]}; none of the {len(sample)} images checked decodes")
    if problems:
        notes.append(f"data: {len(problems)} of {len(sample)} images checked do not decode (Ultralytics skips them), "
                     f"e.g. {problems[0][1]} ('rocm-yolo doctor {path}' checks every image)")
    return notes
