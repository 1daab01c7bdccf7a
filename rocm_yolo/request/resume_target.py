"""``--resume``: which run it continues, and from which of that run's checkpoints.

A resume continues a run in its own directory, so it takes ``RUN/weights/last.pt`` (or
``RUN``, or a mid-epoch checkpoint of the run); a bare ``--resume`` takes the run with the
newest checkpoint under the project. What of the run's own settings it keeps is
:func:`rocm_yolo.run.spec.carry_over`'s rule, the one a watchdog restart follows too.
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError, option
from rocm_yolo.run import weights
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.ultralytics_rules.checkpoint import already_finished, last_epoch, summary


def find_resume(resume: str | bool, project: Path) -> Path:
    """The checkpoint a ``--resume`` names (the run's ``weights/last.pt`` unless a mid-epoch one is named)."""
    if resume is True or resume == "":
        last = weights.find_latest(project)
        if last is None:
            raise UsageError(
                f"no last.pt under {project} to resume: pass the checkpoint, "
                f"e.g. {option('resume', 'runs/detect/train/weights/last.pt')}"
            )
        return last
    last = Path(str(resume)).expanduser().resolve()
    if last.is_dir():
        last = RunPaths(last).last if (last / "weights").is_dir() else last / "last.pt"
    if last.parent.name != "weights":
        raise UsageError(
            f"{option('resume', resume)}: a resume continues a run, so it takes RUN/weights/last.pt; "
            f"to start a new run from these weights use {option('model', resume)}"
        )
    return last


def run_args(last: Path) -> dict:
    """The train arguments the run saved in its newest valid checkpoint (last.pt, its verified copy or a mid-epoch
    one): what Ultralytics' resume trains with (the device, the global batch); {} when none can be read."""
    try:
        path = weights.plan_resume_point(last).path
    except UsageError:
        return {}
    found = summary(path)
    return dict(found.train_args) if found else {}


def resume_point(named: Path, epochs: int | None = None) -> weights.ResumePoint:
    """Where a resume starts, changing nothing: a mid-epoch checkpoint named by the user, else the run's
    newest valid one; with ``epochs`` (``--resume RUN --epochs N``) a finished run trains on to N epochs from
    its ``last.pt`` (:func:`_reopen`). Raises :class:`UsageError` when it has none, when the run has
    finished (and ``epochs`` asks for no more), or when ``epochs`` is fewer than the run has trained."""
    if weights.is_mid_checkpoint(named):
        reason = weights.verify(named)
        if reason is not None:
            raise UsageError(
                f"checkpoint {named} is unusable ({reason}): resume with {option('resume', named.with_name('last.pt'))}"
            )
        point = weights.ResumePoint(named)
    else:
        point = weights.plan_resume_point(named.with_name("last.pt"))
    found = summary(point.path)
    if found is None:
        return point
    run_dir = named.parent.parent
    trained = found.epochs if found.stripped else found.epoch + 1 if found.epoch is not None else None
    if epochs is not None and trained is not None and epochs <= trained and not found.finished:
        raise UsageError(
            f"{option('epochs', epochs)}: the run in {run_dir} has trained {trained} epochs already: give more "
            f"(e.g. {option('epochs', trained + 1)}), or resume without {option('epochs')} to train to its "
            f"{found.epochs}"
        )
    if not found.finished_for(epochs):
        return point
    if epochs is None or not found.epochs or epochs <= found.epochs:
        raise UsageError(already_finished(run_dir, found.epochs))
    return _reopen(point, run_dir, found.epochs, epochs)


def _reopen(point: weights.ResumePoint, run_dir: Path, done: int, epochs: int) -> weights.ResumePoint:
    """A finished run trained on to ``epochs``: from a checkpoint of its last epoch that still holds the optimizer, if
    it has one (``last.pt`` itself when the end of training was cut short; the verified copy of a run that finished
    before rocm-yolo removed it), which becomes ``last.pt`` again; else from ``last.pt``, stripped by the end of
    training: its weights, the epochs trained, and a new optimizer (the training process makes it resumable)."""
    paths = RunPaths(run_dir)
    for kept in (paths.last, paths.last_good):
        found = summary(kept) if weights.verify(kept) is None else None
        if found is not None and not found.stripped:
            note = f"training the finished run on from epoch {done} to {epochs}, from {kept.name}"
            return weights.ResumePoint(paths.last, note, reopen=kept if kept != paths.last else None)
    trained = last_epoch(paths.results) or done
    note = (
        f"training the finished run on from epoch {trained} to {epochs}, from the weights of {paths.last.name} (the "
        "end of training stripped its optimizer: a new one starts)"
    )
    return weights.ResumePoint(paths.last, note)
