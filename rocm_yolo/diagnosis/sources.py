"""Evidence beyond the failure's own text: what a person at the machine would look at next, each from its source.

- the run's memory cgroup (:mod:`rocm_yolo.process.cgroup`): the OOM kills it counted between the attempt's start
  and its end, and the memory it allows (:func:`cgroup_kills`);
- the data set's labels, checked against its ``nc`` as the doctor checks them
  (:func:`rocm_yolo.ultralytics_rules.data.labels.check_label`) after a device-side assert or an index error
  (:func:`labels`);
- the ``HSA_OVERRIDE_GFX_VERSION`` the run's processes had, against each card's own architecture in the KFD
  topology (:func:`overrides`);
- the kernel's view of each thread of a hung tree (:mod:`rocm_yolo.process.kernel_view`) is read by the watch while
  the tree is there, and comes as it is.

Each gives a field of :class:`~.record.Evidence` and says where it came from, or why it has nothing: what cannot
be read is said, never guessed. The mechanism only: :mod:`.diagnose` decides what they mean.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rocm_yolo.gpu.arch import GpuNode, gfx_version
from rocm_yolo.gpu.count import used_gpus
from rocm_yolo.process.cgroup import CgroupMemory
from rocm_yolo.run.devices import gpu_ids
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.ultralytics_rules.data.datasets import DataError, image_files, label_path, load_spec
from rocm_yolo.ultralytics_rules.data.labels import check_label, label_format
from rocm_yolo.ultralytics_rules.tasks import DETECT, OBB, POSE, SEGMENT, task_of_name

LABELS_BUDGET = 30.0  # seconds the label check may take before the restart (a large set is checked in part)
LABELS_SHOWN = 5  # out-of-range lines kept
OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"  # and HSA_OVERRIDE_GFX_VERSION_<node>: one card's (ROCm 6.2+, libhsakmt
# topology.c; ROCm/ROCT-Thunk-Interface#104: the KFD topology's node number, node 0 being the CPU)


def cgroup_kills(ends: tuple[CgroupMemory, CgroupMemory] | None) -> tuple[int | None, int | None, str]:
    """(the OOM kills the run's cgroup counted during the attempt, the bytes it allows, where they were read): None
    kills where either reading could not count them."""
    if ends is None:
        return None, None, "cgroup not read"
    before, after = ends
    if before.oom_kills is None or after.oom_kills is None or before.path != after.path:
        return None, after.limit, (after.why or before.why or "cgroup not readable (moved during the attempt)")
    limit = f", limit {after.limit:,} bytes ({after.limit_at})" if after.limit is not None else ", no memory limit"
    counted = f"oom_kill {before.oom_kills} at the attempt's start, {after.oom_kills} at its end"
    return after.oom_kills - before.oom_kills, after.limit, f"{after.source}: {counted}{limit}"


def labels(spec: RunSpec, phase: str | None, budget: float = LABELS_BUDGET) -> tuple[tuple[str, ...], str]:
    """The label lines of the split the attempt was in (train, or val during validation) whose class id is not one of
    the data set's ``nc`` classes, as the doctor finds them (file and line); and what was checked, or why nothing."""
    split = "val" if phase == "val" else "train"
    task = task_of(spec)
    if task not in (DETECT, SEGMENT, POSE, OBB):
        return (), f"labels not checked (task {task}: no label files with class ids)"
    try:
        data = load_spec(Path(spec.data))
        fmt = label_format(task, data.kpt_shape)
        files, _ = image_files(data.splits.get(split, []))
    except (DataError, OSError, ValueError) as e:
        return (), f"labels not checked ({spec.data}: {e})"
    nc, found, deadline, checked = len(data.names), [], time.monotonic() + budget, 0
    for image in files:
        if time.monotonic() > deadline or len(found) >= LABELS_SHOWN:
            break
        checked += 1
        problem = check_label(label_path(image), nc, fmt)
        if problem is not None and problem[0] == "badclass":
            found.append(problem[1])
    why = "its time was up" if len(found) < LABELS_SHOWN else f"{LABELS_SHOWN} found"
    part = "" if checked == len(files) else f" (the first {checked:,}: {why})"
    said = f"{checked:,} of {len(files):,} {split} label files{part} checked against nc={nc} ({spec.data}'s names)"
    return tuple(found), f"{said}, as rocm_yolo/ultralytics_rules/data/labels.py check_label (the doctor's) does"


def task_of(spec: RunSpec) -> str:
    try:
        return task_of_name(spec.model)
    except Exception:  # a model name of no task Ultralytics knows: its labels are boxes
        return DETECT


def overrides(spec: RunSpec, gpus: list[GpuNode]) -> tuple[tuple[str, str], ...]:
    """(each card's own architecture, the ``HSA_OVERRIDE_GFX_VERSION`` the run's processes gave it) for the cards the
    run used (a run on no GPU named: GPU 0, Ultralytics' default), where an override was set."""
    env = {**os.environ, **spec.env}
    device = str(spec.train_args.get("device", "") or "").strip().lower()
    cards = used_gpus(gpus, gpu_ids(device), env)  # [] (cpu, auto): GPU 0
    found = []
    for card in cards:
        value = env.get(f"{OVERRIDE}_{card.node}", env.get(OVERRIDE, "")).strip()
        if value and gfx_version(card.arch) is not None:
            found.append((card.arch, value))
    return tuple(found)
