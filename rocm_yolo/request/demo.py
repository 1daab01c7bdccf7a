"""The demo data set: coloured shapes on a noisy background, written by the tool itself.

Ultralytics' own sample sets are downloaded on first use; a new user may be offline, so
``rocm-yolo train demo`` writes a small detection set instead: two classes (square,
circle) and a third (triangle), train and val splits, YOLO-format labels and a data YAML.
The set is deterministic (fixed seed), written once per version into a cache directory,
and written atomically (a temporary directory renamed into place), so concurrent runs and
a kill mid-write never leave a half-written set behind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rocm_yolo.run.atomic import check_cache
from rocm_yolo.run.paths import demo_dir

DEMO_VERSION = 1
DEMO_DEFAULTS = {"imgsz": 64, "batch": 8, "plots": False}  # sized for a CPU: 2 epochs in well under a minute
CLASSES = ("square", "circle", "triangle")
COLOURS = ((230, 60, 60), (60, 200, 60), (60, 90, 230))  # BGR, one per class


def default_root() -> Path:
    """Where the demo set lives: ``$ROCM_YOLO_DEMO_DIR`` or the user's cache directory."""
    return demo_dir(DEMO_VERSION)


def _draw(img, cls: int, cx: int, cy: int, r: int, colour) -> None:
    import cv2
    import numpy as np

    if cls == 0:
        cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy + r), colour, thickness=-1)
    elif cls == 1:
        cv2.circle(img, (cx, cy), r, colour, thickness=-1)
    else:
        pts = np.array([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], dtype=np.int32)
        cv2.fillPoly(img, [pts], colour)


def _write_split(root: Path, split: str, count: int, size: int, rng) -> None:
    import cv2
    import numpy as np

    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for i in range(count):
        img = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            cls = int(rng.integers(0, len(CLASSES)))
            r = int(rng.integers(size // 10, size // 5))
            cx, cy = (int(v) for v in rng.integers(r, size - r, size=2))
            _draw(img, cls, cx, cy, r, COLOURS[cls])
            lines.append(f"{cls} {cx / size:.6f} {cy / size:.6f} {2 * r / size:.6f} {2 * r / size:.6f}")
        cv2.imwrite(str(images / f"{split}_{i:04d}.png"), img)
        (labels / f"{split}_{i:04d}.txt").write_text("\n".join(lines) + "\n")


def write_demo(root: Path | None = None, *, train: int = 32, val: int = 16, size: int = 64, seed: int = 0) -> Path:
    """Write the demo set under ``root`` (if not there yet) and return the path of its data YAML."""
    import numpy as np

    root = Path(root) if root is not None else default_root()
    check_cache(root, "the demo data set")  # another user's images and YAML are never trained on as the demo
    yaml_path = root / "demo.yaml"
    if yaml_path.is_file():
        return yaml_path
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=root.parent))
    try:
        rng = np.random.default_rng(seed)
        _write_split(tmp, "train", train, size, rng)
        _write_split(tmp, "val", val, size, rng)
        names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASSES))
        (tmp / "demo.yaml").write_text(
            f"# rocm-yolo demo set: {train} train and {val} val images of {size}x{size} px\n"
            f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n"
        )
        try:
            tmp.rename(root)
        except OSError:  # another process won the race: use its copy
            if not yaml_path.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return yaml_path
