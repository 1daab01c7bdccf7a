"""Taking the run directory for a spec: after validation, before the supervisor starts.

A new run claims ``project/name`` (or the next free name: ``train``, ``train-2``, ...) and
holds its lock; ``exist_ok=True`` reuses an existing directory unless it holds a checkpoint
of another run or another supervisor holds it (and drops the old run's tracker record). A
resume first refuses a run that has finished (writing nothing), then holds its run's lock
and takes the checkpoint it starts from (which may move a damaged ``last.pt`` aside).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.launch import ownership
from rocm_yolo.launch.resume_target import resume_point
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec, next_attempt


def claim(spec: RunSpec) -> RunSpec:
    """The spec with its run directory claimed and held by this process (and, for a resume, its checkpoint).

    A new directory is recorded as this run's own (``spec.created``): clean-up touches only such a one.
    """
    if spec.resume is not None:
        return _claim_resume(spec)
    run_dir, created = _claim_new(Path(spec.run_dir), bool(spec.train_args.get("exist_ok", False)))
    train_args = {**spec.train_args, "project": str(run_dir.parent), "name": run_dir.name, "exist_ok": True}
    attempt = 1 if created else next_attempt(run_dir)  # a reused directory keeps the reports already in it
    if not created:  # a new run opens new tracker runs: only its own attempts continue them
        RunPaths(run_dir).tracker.unlink(missing_ok=True)
    return spec.with_changes(run_dir=str(run_dir), train_args=train_args, created=created, attempt=attempt)


def _claim_new(wanted: Path, exist_ok: bool) -> tuple[Path, bool]:
    """(the directory, whether this run created it). Ultralytics' naming: ``train``, ``train-2``, ...

    With ``exist_ok=True`` an existing directory is reused, unless it holds a checkpoint of
    another run (only a resume continues that one) or another supervisor holds it.
    """
    if exist_ok and wanted.is_dir():
        ownership.acquire(wanted)  # refuses a live run before anything is touched
        found = RunPaths(wanted).checkpoints()
        if found:
            ownership.release(wanted)
            raise UsageError(
                f"{wanted} already holds {found[0].relative_to(wanted)}, a checkpoint of another run: continue "
                f"it with --resume {RunPaths(wanted).last}, or choose another --name"
            )
        return wanted, False
    path = ownership.claim_run_dir(wanted.parent, wanted.name)
    ownership.acquire(path)
    return path, True


def _claim_resume(spec: RunSpec) -> RunSpec:
    resume_point(Path(spec.resume))  # a finished run, or nothing to resume: refused before anything is written
    ownership.acquire(spec.run_dir)  # refuses a live run before anything in it is touched
    try:
        ckpt, note = resume_point(Path(spec.resume)).take()
    except BaseException:
        ownership.release(spec.run_dir)
        raise
    return spec.with_changes(resume=str(ckpt), model=str(ckpt), notes=spec.notes + ((note,) if note else ()))


def remove_fresh_run(spec: RunSpec) -> None:
    """After a usage error before training: remove the run directory if this run created it and it holds no weights."""
    run_dir = Path(spec.run_dir)
    if not spec.created or any(RunPaths(run_dir).weights.glob("*.pt")) or ownership.holder(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
