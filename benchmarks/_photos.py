"""A real-photo detection set for loading figures: synthetic squares decode and augment far
faster than photographs, so loader speed measured on them says little about a real data set.

The images are random crops of Ultralytics' own sample photos (``assets/bus.jpg`` and
``zidane.jpg``, shipped inside the ultralytics package, so nothing is downloaded), scaled to
640x480 and written as JPEG (quality 90), with 1-6 random boxes each. scikit-image's sample
images (astronaut, coffee, chelsea) are used as well where scikit-image is installed (the GPU
machine has it; this project's CPU machine does not). Deterministic for a given seed; written
once per directory.
"""

from __future__ import annotations

from pathlib import Path

WIDTH, HEIGHT = 640, 480
CLASSES = ("person", "bus", "thing")


def sources() -> list:
    """The source photos as BGR arrays: Ultralytics' assets, plus scikit-image's where installed."""
    import cv2
    import ultralytics

    assets = Path(ultralytics.__file__).parent / "assets"
    photos = [cv2.imread(str(assets / name)) for name in ("bus.jpg", "zidane.jpg")]
    try:
        from skimage import data as skdata

        for name in ("astronaut", "coffee", "chelsea"):
            photos.append(cv2.cvtColor(getattr(skdata, name)(), cv2.COLOR_RGB2BGR))
    except Exception:  # noqa: BLE001 - optional: not installed, or a sample image missing
        pass
    photos = [p for p in photos if p is not None]
    if not photos:
        raise SystemExit(f"no source photos found in {assets}")
    return photos


def _write_split(root: Path, split: str, count: int, photos: list, rng) -> None:
    import cv2

    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        src = photos[int(rng.integers(len(photos)))]
        h, w = src.shape[:2]
        scale = float(rng.uniform(0.5, 1.0))  # crop 50-100% of the photo's short side, 4:3
        ch = int(min(h, w * 3 / 4) * scale)
        cw = int(ch * 4 / 3)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = cv2.resize(src[y : y + ch, x : x + cw], (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
        if rng.random() < 0.5:
            img = img[:, ::-1]
        cv2.imwrite(str(images / f"{split}_{i:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        lines = []
        for _ in range(int(rng.integers(1, 7))):
            bw, bh = rng.uniform(0.05, 0.5, size=2)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{int(rng.integers(len(CLASSES)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        (labels / f"{split}_{i:05d}.txt").write_text("\n".join(lines) + "\n")


def write_photo_set(root: Path, *, train: int = 256, val: int = 32, seed: int = 0) -> Path:
    """Write the set under ``root`` (unless its YAML exists already) and return the data YAML."""
    import numpy as np

    root = Path(root)
    yaml_path = root / "photos.yaml"
    if yaml_path.is_file():
        return yaml_path
    rng = np.random.default_rng(seed)
    photos = sources()
    _write_split(root, "train", train, photos, rng)
    _write_split(root, "val", val, photos, rng)
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASSES))
    yaml_path.write_text(
        f"# {train} train and {val} val real-photo crops, {WIDTH}x{HEIGHT} JPEG\n"
        f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}\n"
    )
    return yaml_path
