"""``--resume``: which run it continues, and from which of that run's checkpoints.

A resume continues a run in its own directory, so it takes ``RUN/weights/last.pt`` (or
``RUN``, or a mid-epoch checkpoint of the run); a bare ``--resume`` takes the run with the
newest checkpoint under the project. What of the run's own settings it keeps is
:func:`rocm_yolo.run.spec.carry_over`'s rule, the one a watchdog restart follows too.
"""

from __future__ import annotations

from pathlib import Path
from shlex import quote

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
            f"to start a new run from these weights use --model {quote(str(resume))}"
        )
    return last


def run_args(last: Path) -> dict:
    """The train arguments the run saved in its newest valid checkpoint (last.pt, its verified copy or a mid-epoch
    one): what Ultralytics' resume trains with (the device, the global batch); {} when none can be read."""
    try:
        path = checkpoints.plan_resume_point(last).path
    except UsageError:
        return {}
    found = summary(path)
    return dict(found.train_args) if found else {}


def resume_point(named: Path, epochs: int | None = None) -> checkpoints.ResumePoint:
    """Where a resume starts, changing nothing: a mid-epoch checkpoint named by the user, else the run's
    newest valid one; with ``epochs`` (``--resume RUN --epochs N``) a finished run trains on to N epochs from
    the copy it keeps with its optimizer. Raises :class:`UsageError` when it has none, when the run has
    finished (and ``epochs`` asks for no more), or when ``epochs`` is fewer than the run has trained."""
    if checkpoints.is_mid_checkpoint(named):
        reason = checkpoints.verify(named)
        if reason is not None:
            raise UsageError(
                f"checkpoint {named} is unusable ({reason}): resume with "
                f"--resume {quote(str(named.with_name('last.pt')))}"
            )
        point = checkpoints.ResumePoint(named)
    else:
        point = checkpoints.plan_resume_point(named.with_name("last.pt"))
    found = summary(point.path)
    if found is None:
        return point
    run_dir = named.parent.parent
    trained = found.epochs if found.stripped else found.epoch + 1 if found.epoch is not None else None
    if epochs is not None and trained is not None and epochs <= trained and not found.finished:
        raise UsageError(
            f"--epochs {epochs}: the run in {run_dir} has trained {trained} epochs already: give more "
            f"(e.g. --epochs {trained + 1}), or resume without --epochs to train to its {found.epochs}"
        )
    if not found.finished_for(epochs):
        return point
    if epochs is None or not found.epochs or epochs <= found.epochs:
        raise UsageError(already_finished(run_dir, found.epochs))
    return _reopen(point, run_dir, found.epochs, epochs)


def _reopen(point: checkpoints.ResumePoint, run_dir: Path, done: int, epochs: int) -> checkpoints.ResumePoint:
    """A finished run trained on to ``epochs``: from the verified copy it keeps with its optimizer, which becomes
    ``last.pt`` again (the end of training stripped that one)."""
    paths = RunPaths(run_dir)
    kept = summary(paths.last_good) if checkpoints.verify(paths.last_good) is None else None
    if kept is None or kept.stripped:
        raise UsageError(
            f"the run in {run_dir} finished all {done} epochs and keeps no copy with its optimizer to train on "
            f"from (it finished before rocm-yolo kept weights/{paths.last_good.name}): start a new run from its "
            f"weights with --model {quote(str(paths.last))} epochs={epochs}"
        )
    note = f"training the finished run on from epoch {done} to {epochs}, from {paths.last_good.name}"
    return checkpoints.ResumePoint(paths.last, note, reopen=paths.last_good)
