"""Class-per-folder data (classify), read as Ultralytics' ``check_cls_dataset`` reads it, without importing it.

``train/<class>/``, ``val/`` or ``validation/``/``valid/``/``test/``, class names from the
train folders (or an NDJSON set's ``.ndjson.yaml``), and the 80/20 split Ultralytics makes
of a directory without ``train/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rocm_yolo.ultralytics_rules.data.datasets import DataError, is_image, walk_images


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
                    elif is_image(entry.name):
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
        raise DataError(
            f"{path} has no val/ folder (nor validation/, valid/ or test/), which Ultralytics validates on: "
            f"put some images of each class in {path}/val/<class>/"
        )
    splits = {"train": train, **({"val": val} if val else {}), **({"test": test} if test else {})}
    return ClassifySpec(path, names, splits)


def classify_images(split_dir: Path) -> tuple[dict[str, list[str]], list[str]]:
    """(class folder -> its images, images directly in ``split_dir``, which ImageFolder ignores)."""
    by_class: dict[str, list[str]] = {}
    loose: list[str] = []
    for image in walk_images(split_dir):
        rel = Path(image).relative_to(split_dir)
        if len(rel.parts) == 1:
            loose.append(image)
        else:
            by_class.setdefault(rel.parts[0], []).append(image)
    return by_class, loose
