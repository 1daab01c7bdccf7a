"""``--resume``: which run it continues, and from which of that run's checkpoints.

A resume continues a run in its own directory, so it takes ``RUN/weights/last.pt`` (or
``RUN``, or a mid-epoch checkpoint of the run); a bare ``--resume`` takes the run with the
newest checkpoint under the project. What of the run's own settings it keeps is
:func:`rocm_yolo.run.spec.carry_over`'s rule, the one a watchdog restart follows too.
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.run import checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.ultralytics_rules.checkpoint import already_finished, summary


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
        raise UsageError(already_finished(named.parent.parent, found.epochs))
    return point
