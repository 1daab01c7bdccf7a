"""Dataset YAMLs (detect, segment, pose, obb), read as Ultralytics' ``check_det_dataset`` reads them, without it.

:func:`load_spec` resolves a YAML (``path:`` root, train/val/test entries that are
directories, ``.txt`` image lists or lists of either) and :func:`image_files` lists a split
as ``get_img_files`` does; images/... -> labels/... (:func:`label_path`). Ultralytics'
``datasets_dir`` comes from the settings file it really uses. Each line's checks are in
:mod:`.labels`, class-per-folder data (classify) in :mod:`.classify`, the check the CLI runs
before a run in :mod:`.check`.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

from rocm_yolo.run.atomic import untrusted

# Ultralytics' ultralytics.data.utils.IMG_FORMATS (8.4), copied: importing it imports torch.
IMG_FORMATS = {"avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp"}
ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".xz", ".bz2", ".txz", ".tbz2")  # check_cls_dataset unpacks these


class DataError(Exception):
    """The data cannot be used at all (one line)."""


def file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "special file"


def read_text(path: Path) -> str:
    """A YAML or list the user named, read; DataError for a FIFO, socket or device (reading one would block)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise DataError(f"{path} is a {file_kind(mode)}, not a regular file (reading it would block)")
    return path.read_text(errors="replace")


@dataclass
class DataSpec:
    yaml: Path
    root: Path
    names: dict[int, str]
    splits: dict[str, list[Path]]  # split -> resolved entries (dirs, txt lists, files)
    kpt_shape: list | None = None
    channels: int = 3


SHARED_FALLBACK = Path("/tmp") / "Ultralytics"  # older Ultralytics' fallback: any user can make it first


def settings_file(env=os.environ) -> Path | None:
    """The ``settings.json`` Ultralytics uses on Linux (``get_user_config_dir``), or None.

    ``$YOLO_CONFIG_DIR/Ultralytics``, else ``$XDG_CONFIG_HOME/Ultralytics``, else ``~/.config/Ultralytics``,
    whenever that folder is there or can be made. Only where it cannot does Ultralytics fall back to
    ``$TMPDIR/Ultralytics-UID`` (8.4.190: only its user's own 0700 folder) or ``/tmp/Ultralytics`` (8.4.158, any
    user's): such a fallback is read only when the folder and the file are the user's own and not links, so that no
    one else chooses the ``datasets_dir`` a run resolves its data against.
    """
    if env.get("YOLO_CONFIG_DIR"):
        first = Path(env["YOLO_CONFIG_DIR"]).expanduser() / "Ultralytics"
    else:
        first = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "Ultralytics"
    if _can_be_made(first):
        return first / "settings.json"
    for base in (Path(tempfile.gettempdir()) / f"Ultralytics-{os.getuid()}", SHARED_FALLBACK):
        file = base / "settings.json"
        if file.is_file() and untrusted(base) is None and untrusted(file) is None:
            return file
    return None


def _can_be_made(folder: Path) -> bool:
    """Whether ``folder`` is there, or ``mkdir(parents=True)`` would make it (its nearest ancestor is writable)."""
    if folder.is_dir():
        return True
    for parent in folder.parents:
        if parent.exists():
            return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return False


def setting(key: str, env=os.environ):
    """Ultralytics' setting ``key``, read from its settings file without importing it; None without one."""
    path = settings_file(env)
    try:
        return json.loads(path.read_text())[key] if path is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def detection_layout(path: Path) -> bool:
    """Whether the directory ``path`` is laid out as Ultralytics' detection-style tasks read it: ``images/`` beside
    ``labels/`` (a label file is the image's path with ``images`` replaced by ``labels``: ``img2label_paths``)."""
    return (path / "images").is_dir() and (path / "labels").is_dir()


def datasets_dir(env=os.environ) -> Path | None:
    """Ultralytics' ``datasets_dir`` setting, read from its settings file without importing it."""
    found = setting("datasets_dir", env)
    return Path(found) if found else None


def load_spec(yaml_path: Path) -> DataSpec:
    import yaml

    try:
        data = yaml.safe_load(read_text(yaml_path))
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


def is_image(name: str) -> bool:
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
    return sorted(x for x in files if is_image(x)), missing


def _listed(txt: Path) -> list[str]:
    parent = str(txt.parent) + os.sep
    lines = txt.read_text(errors="replace").strip().splitlines()
    return [x.replace("./", parent, 1) if x.startswith("./") else x for x in (y.strip() for y in lines) if x]


def walk_images(folder: Path) -> Iterator[str]:
    """Image files under ``folder``, lazily, in a stable order (a sample need not list everything)."""
    for top, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if is_image(name):
                yield os.path.join(top, name)


def sample_images(entries: list[Path], count: int) -> list[str]:
    """The first ``count`` image files of a split, without listing all of it; [] if a path is missing."""
    found: list[str] = []
    for p in entries:
        if p.is_dir():
            found += islice(walk_images(p), count - len(found))
        elif p.is_file():
            found += [x for x in _listed(p) if is_image(x)][: count - len(found)]
        if len(found) >= count:
            break
    return found


def symlink_loops(entries: list[Path]) -> list[str]:
    """Links in a split's folders that lead back to a folder above them: Ultralytics' recursive glob follows them and
    lists the same images again and again (under names no label file has)."""
    loops = []
    for entry in entries:
        if not entry.is_dir():
            continue
        for top, dirs, _ in os.walk(entry, followlinks=False):
            here = os.path.realpath(top)
            for name in dirs:
                link = os.path.join(top, name)
                target = os.path.realpath(link)
                if os.path.islink(link) and (here == target or here.startswith(target + os.sep)):
                    loops.append(link)
    return loops


def label_path(image: str) -> str:
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"
