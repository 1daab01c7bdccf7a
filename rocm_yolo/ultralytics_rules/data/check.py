"""The check the CLI runs on DATA before anything starts: the structure, and a sample of labels or images.

Data Ultralytics would refuse (or that would train on nothing) is a :class:`DataError`;
problems Ultralytics gets past by skipping images are notes for the run header. A full
scan of a large set is the doctor's job (:mod:`rocm_yolo.doctor.data_checks`), with the same functions.
"""

from __future__ import annotations

from pathlib import Path
from shlex import quote

from rocm_yolo.ultralytics_rules.data.classify import first_images, load_classify_spec
from rocm_yolo.ultralytics_rules.data.datasets import DataError, label_path, load_spec, sample_images, symlink_loops
from rocm_yolo.ultralytics_rules.data.labels import check_image, check_label, label_format
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

LABEL_TASKS = (DETECT, SEGMENT, POSE, OBB)  # tasks whose labels are YOLO .txt lines
SAMPLE = 32  # label files (or images) per split the CLI checks before a run


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
        _check_split(split, spec.splits.get(split, []), files)
        loops = symlink_loops(spec.splits.get(split, []))
        if loops:
            notes.append(
                f"data: {loops[0]} is a link to a folder above it: Ultralytics lists the images below it again and "
                "again, under names no label file has (remove the link)"
            )
        found = [(f, check_label(label_path(f), nc, fmt)) for f in files]
        labelled = [(f, p) for f, p in found if not (p and p[0] == "nolabel")]
        problems = [p for _, p in labelled if p]
        fatal = next((p for p in problems if p[0] in ("boxrow", "special")), None)
        if fatal:
            raise DataError(fatal[1])
        if problems and len(problems) == len(labelled):
            raise DataError(
                f"{problems[0][1]}; each of the first {len(labelled)} {split} label files has such a "
                f"problem (a {task} label line has {fmt.expected()} numbers)"
            )
        if problems:
            notes.append(
                f"data: {len(problems)} of the first {len(labelled)} {split} label files have problems "
                f"Ultralytics skips the image for, e.g. {problems[0][1]} "
                f"('rocm-yolo doctor {quote(str(data))} --task {task}' checks every file)"
            )
        if files and not labelled and split == "train":
            notes.append(
                f"data: none of the first {len(files)} train images has a label file (e.g. "
                f"{label_path(files[0])}): Ultralytics trains on them as backgrounds"
            )
    return notes


def _check_split(split: str, entries: list[Path], sample: list[str]) -> None:
    """A train or val split that is missing, or that holds no image: Ultralytics refuses it once the child has
    started (and, for a new run, unlinked a results.csv of the folder): refuse it before anything starts."""
    missing = [str(p) for p in entries if not p.exists()]
    if missing:
        raise DataError(f"{split}: {missing[0]} not found: fix the path ({split}: in the YAML, relative to path:)")
    if not sample:
        where = ", ".join(str(p) for p in entries) or "(nothing)"
        raise DataError(
            f"{split}: {where} holds no images (jpg, png, ...): put the {split} images there, or point {split}: "
            "at a folder or list that has them"
        )


def _check_classify(path: Path) -> list[str]:
    spec = load_classify_spec(path)
    names = ", ".join(list(spec.names.values())[:10]) + (", ..." if len(spec.names) > 10 else "")
    count = len(spec.names)
    notes = [f"data: classification, {count} class{'' if count == 1 else 'es'} ({names})"]
    if spec.auto_split:
        notes.append(
            f"data: {path} has no train/ folder: Ultralytics first copies its class folders into "
            f"{path}_split/train and val (80/20) and trains on that"
        )
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
        notes.append(
            f"data: {len(problems)} of {len(sample)} images checked do not decode (Ultralytics skips them), "
            f"e.g. {problems[0][1]} ('rocm-yolo doctor {quote(str(path))}' checks every image)"
        )
    return notes
