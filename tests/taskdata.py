"""Tiny real data sets for every Ultralytics task, written by the tests themselves (offline).

Two classes of coloured shapes (square, circle) on a noisy background, 32 px images, in each
task's own layout:

- ``classify``: a directory ``train/<class>/*.png`` and ``val/<class>/*.png`` (no YAML);
- ``segment``: YOLO polygons (``class x1 y1 x2 y2 ...``) of each shape;
- ``pose``: a box plus 3 keypoints ``x y visible`` per shape (``kpt_shape: [3, 3]``);
- ``obb``: the 4 corner points of a rotated square (``class x1 y1 ... x4 y4``).

Deterministic (fixed seed); a few images each, so one epoch is two batches of 4.
"""

from __future__ import annotations

import math
from pathlib import Path

CLASSES = ("square", "circle")
COLOURS = ((230, 60, 60), (60, 200, 60))
TASKS = ("classify", "segment", "pose", "obb")


def _shape(rng, size: int, cls: int, rotated: bool):
    """One shape: its image-space polygon (float points) and its centre/radius."""
    r = float(rng.integers(size // 5, size // 3))
    cx, cy = (float(v) for v in rng.integers(int(r) + 1, size - int(r) - 1, size=2))
    if cls == 0:
        angle = float(rng.uniform(0, math.pi / 2)) if rotated else math.pi / 4
        points = [
            (cx + r * math.cos(angle + k * math.pi / 2), cy + r * math.sin(angle + k * math.pi / 2)) for k in range(4)
        ]
    else:
        points = [(cx + r * math.cos(k * math.pi / 6), cy + r * math.sin(k * math.pi / 6)) for k in range(12)]
    return points, cx, cy, r


def _label(task: str, cls: int, points, cx: float, cy: float, r: float, size: int) -> str:
    n = lambda v: f"{min(max(v / size, 0.0), 1.0):.5f}"  # noqa: E731
    if task == "segment" or task == "obb":
        corners = points if task == "segment" or cls == 0 else points[::3]  # obb: 4 corners of the shape
        return f"{cls} " + " ".join(f"{n(x)} {n(y)}" for x, y in corners)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    box = f"{cls} {n((x0 + x1) / 2)} {n((y0 + y1) / 2)} {n(x1 - x0)} {n(y1 - y0)}"
    keypoints = ((cx, cy - r / 2), (cx - r / 2, cy + r / 2), (cx + r / 2, cy + r / 2))  # top, bottom-left, bottom-right
    return box + "".join(f" {n(x)} {n(y)} 2" for x, y in keypoints)


def _image(rng, size: int, shapes) -> "object":
    import cv2
    import numpy as np

    img = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    for cls, points in shapes:
        cv2.fillPoly(img, [np.array(points, dtype=np.int32)], COLOURS[cls])
    return img


def write_task_data(root: Path, task: str, *, train: int = 8, val: int = 4, size: int = 32, seed: int = 0) -> Path:
    """Write ``task``'s data set under ``root``; return what ``rocm-yolo train`` takes (YAML or directory)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    root = Path(root)
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            cls = i % len(CLASSES)
            points, cx, cy, r = _shape(rng, size, cls, rotated=task == "obb")
            img = _image(rng, size, [(cls, points)])
            if task == "classify":
                folder = root / split / CLASSES[cls]
                folder.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(folder / f"{split}_{i:03d}.png"), img)
                continue
            images, labels = root / "images" / split, root / "labels" / split
            images.mkdir(parents=True, exist_ok=True)
            labels.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(images / f"{split}_{i:03d}.png"), img)
            (labels / f"{split}_{i:03d}.txt").write_text(_label(task, cls, points, cx, cy, r, size) + "\n")
    if task == "classify":
        return root
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(CLASSES))
    extra = "kpt_shape: [3, 3]\nflip_idx: [0, 2, 1]\n" if task == "pose" else ""
    yaml = root / f"{task}.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\n{extra}names:\n{names}")
    return yaml


def write_all(root: Path, **kwargs) -> dict[str, Path]:
    """Every task's data set under ``root/TASK``."""
    return {task: write_task_data(Path(root) / task, task, **kwargs) for task in TASKS}


def copy_task(task_data: dict[str, Path], task: str, tmp_path: Path) -> Path:
    """A private copy of ``task``'s data (the shared one trains concurrently); its YAML or directory."""
    import shutil

    src = task_data[task] if task == "classify" else task_data[task].parent
    dst = tmp_path / task
    shutil.copytree(src, dst)
    if task == "classify":
        return dst
    yaml = dst / task_data[task].name
    yaml.write_text(yaml.read_text().replace(str(src), str(dst)))
    return yaml
