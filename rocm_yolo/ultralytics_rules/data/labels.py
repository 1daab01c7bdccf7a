"""One image and one label file, checked as Ultralytics' ``verify_image_label`` would for each task.

:func:`check_label` checks a label file line by line with the rules of the task's
:class:`LabelFormat`: boxes, polygons (segment), keypoints against ``kpt_shape`` (pose),
corner points (obb); a problem names its file and line. :func:`check_image` decodes an
image and never opens a file that is not a regular one (a FIFO would block).
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.ultralytics_rules.data.datasets import DataError, file_kind
from rocm_yolo.ultralytics_rules.tasks import DETECT, OBB, POSE, SEGMENT

NO_CV2_DECODE = {"avif", "heic", "heif"}  # Ultralytics opens these through Pillow plugins


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
    ok = (
        isinstance(kpt_shape, (list, tuple))
        and len(kpt_shape) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in kpt_shape)
        and kpt_shape[0] > 0
        and kpt_shape[1] in (2, 3)
    )
    return (
        None
        if ok
        else (
            f"kpt_shape: {kpt_shape} is not [keypoints, dims] with keypoints > 0 and dims 2 (x y) "
            "or 3 (x y visible), e.g. kpt_shape: [17, 3]"
        )
    )


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
            return (
                f"{self.pose_columns} (class x y w h, then {self.nkpt} keypoints of {self.ndim} values, "
                f"as kpt_shape [{self.nkpt}, {self.ndim}] says)"
            )
        if self.task == OBB:
            return "9 (class x1 y1 x2 y2 x3 y3 x4 y4: the 4 corner points)"
        if self.task == SEGMENT:
            return "a polygon (class x1 y1 x2 y2 x3 y3 ...: 3 points or more)"
        return "5 (class x y w h) or a polygon (class x1 y1 x2 y2 x3 y3 ...)"


def label_format(task: str, kpt_shape=None) -> LabelFormat:
    """The label format of ``task`` with the YAML's ``kpt_shape``; DataError when pose lacks a usable one."""
    if kpt_shape is not None or task == POSE:
        problem = (
            "no 'kpt_shape:' (e.g. kpt_shape: [17, 3]): pose labels need it"
            if kpt_shape is None
            else kpt_shape_problem(kpt_shape)
        )
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
        return "boxrow", (
            f"{path}:{shapes[0][0]}: a box (class x y w h) where {fmt.task} needs {fmt.expected()}: "
            f"Ultralytics refuses a {fmt.task} data set with box-only label files "
            "(releases before 8.4.84 dropped every polygon instead)"
        )
    return None
