"""``cache=ram`` and shared memory: how big Ultralytics' image cache gets, and whether its workers can share it.

Ultralytics caches a data set's images resized to ``imgsz`` (``BaseDataset.cache_images``), the train and
the val split each. Its DataLoader workers made by fork share that memory copy-on-write; rocm-yolo's
come from a fork server, so each worker gets the dataset pickled. Since 8.4.1xx the cache is one tensor
(``BaseDataset._ImageCache``) that pickles as shared memory in ``/dev/shm``, but only when ``/dev/shm``
has twice its size free (the margin ``check_cache_ram`` keeps); otherwise, and always with an older
Ultralytics (a list of arrays), every worker gets a copy of its own: a 20 GB cache with 8 workers is
160 GB. :func:`estimate` and :func:`shared_memory` let the request's checks decide before anything starts.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.ultralytics_rules.config import package_dir
from rocm_yolo.ultralytics_rules.data.datasets import DataError, image_files, load_spec, walk_images
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY

SAMPLE = 30  # images read to estimate, as check_cache_ram does
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class CacheEstimate:
    bytes: int  # the train and val caches together
    images: int

    def describe(self) -> str:
        size = f"{self.bytes / 2**30:.1f} GiB" if self.bytes >= 2**30 else f"{self.bytes / 2**20:.1f} MiB"
        return f"{size} for {self.images:,} images"


def split_images(data: str, task: str) -> list[list[str]]:
    """The train and val images of ``data`` as Ultralytics caches them ([] where they cannot be listed here)."""
    path = Path(data)
    try:
        if task == CLASSIFY:
            return [list(walk_images(path / split)) for split in ("train", "val") if (path / split).is_dir()]
        spec = load_spec(path)
    except (OSError, DataError):
        return []
    return [image_files(spec.splits.get(split, []))[0] for split in ("train", "val")]


def estimate(image_sets: list[list[str]], imgsz: int, seed: int = 0) -> CacheEstimate:
    """The bytes ``cache=ram`` holds for these splits' images at ``imgsz`` (each resized so its long side is
    ``imgsz``, as ``load_image`` does), extrapolated from a sample of each split."""
    import cv2

    rng = random.Random(seed)
    total, count = 0.0, 0
    for images in image_sets:
        if not images:
            continue
        sample = rng.sample(images, min(SAMPLE, len(images)))
        sizes = []
        for path in sample:
            im = cv2.imread(path)
            if im is not None:
                h, w = im.shape[:2]
                ratio = imgsz / max(h, w)
                sizes.append(im.nbytes * ratio**2)
        if sizes:
            total += sum(sizes) / len(sizes) * len(images)
        count += len(images)
    return CacheEstimate(int(total), count)


def shared_memory(path: Path = SHM) -> tuple[int, int] | None:
    """``(total, free)`` bytes of ``/dev/shm``, or None when it is not there."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def shares_ram_cache() -> bool:
    """Whether the installed Ultralytics passes its RAM cache to workers through shared memory (its
    ``_ImageCache``), read from its source without importing it."""
    try:
        return "class _ImageCache" in (package_dir() / "data" / "base.py").read_text(encoding="utf-8")
    except (OSError, Exception):  # noqa: BLE001 - no Ultralytics, an unreadable file: it does not
        return False
