"""``--resume``: which run it continues, and which of that run's own settings carry over.

A resume continues a run in its own directory, so it takes ``RUN/weights/last.pt`` (or
``RUN``, or a mid-epoch checkpoint of the run); a bare ``--resume`` takes the run with the
newest checkpoint under the project. It keeps the run's profile and the user's own settings
of it (workers, ``val=``, loader overrides, ``--conv``, the checkpoint interval) unless new
ones are given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rocm_yolo.errors import UsageError
from rocm_yolo.run import checkpoints
from rocm_yolo.run.interval import parse_interval
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.profiles import LOADER_KEYS
from rocm_yolo.run.spec import RunSpec, latest_spec
from rocm_yolo.ultralytics_rules.checkpoint import summary

if TYPE_CHECKING:
    from rocm_yolo.launch.request import Request


def find_resume(resume: str | bool, project: Path) -> Path:
    """The checkpoint a ``--resume`` names (the run's ``weights/last.pt`` unless a mid-epoch one is named)."""
    if resume is True or resume == "":
        last = checkpoints.find_latest(project)
        if last is None:
            raise UsageError(
                f"no last.pt under {project} to resume: pass the checkpoint, "
                "e.g. --resume runs/detect/train/weights/last.pt"
            )
        return last
    last = Path(str(resume)).expanduser().resolve()
    if last.is_dir():
        last = RunPaths(last).last if (last / "weights").is_dir() else last / "last.pt"
    if last.parent.name != "weights":
        raise UsageError(
            f"--resume {resume}: a resume continues a run, so it takes RUN/weights/last.pt; "
            f"to start a new run from these weights use --model {resume}"
        )
    return last


def carry_over(req: "Request", run_dir: Path) -> RunSpec | None:
    """Fill ``req`` with the settings of ``run_dir``'s newest attempt the user did not give again; that spec."""
    previous = latest_spec(run_dir)
    if previous is None:
        written = RunPaths(run_dir).specs()
        if written:  # e.g. by another rocm-yolo version: say so rather than drop the run's settings silently
            req.notes.append(
                f"the run's settings in {written[-1].name} cannot be read (written by another rocm-yolo "
                "version?): the resume takes the defaults and what you give now"
            )
        return None
    if req.profile is None:
        req.profile = previous.profile
    if req.flags["workers"] is None and req.profile == previous.profile:
        # the run's own request: safe halves it again from that, never from its own halved count
        req.flags["workers"] = (
            previous.loader.workers if previous.workers_requested is None else previous.workers_requested
        )
    if req.profile != previous.profile:
        req.notes.append(f"resume changes the profile: {previous.profile} -> {req.profile}")
    else:  # same profile: the user's own settings of that run still hold
        for key in LOADER_KEYS & set(previous.user_keys) - set(req.loader):
            req.loader[key] = getattr(previous.loader, key)
        if req.val is None and "val" in previous.user_keys:
            req.val = previous.val
        req.user_keys |= (LOADER_KEYS | {"val"}) & set(previous.user_keys)
    if req.conv is None and "conv" in previous.user_keys:
        req.conv = previous.conv
        req.user_keys.add("conv")
    if req.interval is None:
        req.interval = parse_interval(previous.checkpoint_every)
    return previous


def trained_on(last: Path) -> str | None:
    """The device the run was trained on, as its checkpoint records it (Ultralytics' resume takes it from there)."""
    found = summary(last) if last.exists() else None
    device = (found.train_args if found else {}).get("device")
    return None if device is None or str(device).strip() == "" else str(device)


def resume_point(named: Path) -> checkpoints.ResumePoint:
    """Where a resume starts, changing nothing: a mid-epoch checkpoint named by the user, else the run's
    newest valid one. Raises :class:`UsageError` when it has none, or when its run has finished."""
    if checkpoints.is_mid_checkpoint(named):
        reason = checkpoints.verify(named)
        if reason is not None:
            raise UsageError(
                f"checkpoint {named} is unusable ({reason}): resume with --resume {named.with_name('last.pt')}"
            )
        return checkpoints.ResumePoint(named)
    point = checkpoints.plan_resume_point(named.with_name("last.pt"))
    found = summary(point.path)
    if found is not None and found.finished:
        raise UsageError(
            f"the run in {named.parent.parent} has already finished all {found.epochs} epochs: nothing to "
            "resume (start a new run without --resume to train again)"
        )
    return point
