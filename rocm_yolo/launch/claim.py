"""Taking the run directory for a spec: after validation, before the supervisor starts.

A new run claims ``project/name`` (or the next free name: ``train``, ``train-2``, ...) and
holds its lock; ``exist_ok=True`` reuses an existing directory unless it holds a run to
resume or another supervisor holds it. A resume holds its run's lock and then chooses the
checkpoint it starts from (which may move a damaged ``last.pt`` aside).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.launch.resume import resume_point
from rocm_yolo.run import ownership
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec


def claim(spec: RunSpec) -> RunSpec:
    """The spec with its run directory claimed and held by this process (and, for a resume, its checkpoint)."""
    if spec.resume is not None:
        return _claim_resume(spec)
    run_dir = _claim_new(Path(spec.run_dir), bool(spec.train_args.get("exist_ok", False)))
    train_args = {**spec.train_args, "project": str(run_dir.parent), "name": run_dir.name, "exist_ok": True}
    return spec.with_changes(run_dir=str(run_dir), train_args=train_args)


def _claim_new(wanted: Path, exist_ok: bool) -> Path:
    """Ultralytics' naming: ``train``, ``train-2``, ... With ``exist_ok=True`` an existing
    directory is reused, unless it holds a run to resume or another supervisor holds it."""
    if exist_ok and wanted.is_dir():
        ownership.acquire(wanted)  # refuses a live run before anything is touched
        if RunPaths(wanted).last.exists():
            ownership.release(wanted)
            raise UsageError(
                f"{wanted} already holds weights/last.pt: continue it with --resume {RunPaths(wanted).last}, "
                "or choose another --name"
            )
        return wanted
    path = ownership.claim_run_dir(wanted.parent, wanted.name)
    ownership.acquire(path)
    return path


def _claim_resume(spec: RunSpec) -> RunSpec:
    ownership.acquire(spec.run_dir)  # refuses a live run before anything in it is touched
    try:
        ckpt, note = resume_point(Path(spec.resume))
    except BaseException:
        ownership.release(spec.run_dir)
        raise
    return spec.with_changes(resume=str(ckpt), model=str(ckpt), notes=spec.notes + ((note,) if note else ()))


def remove_fresh_run(run_dir: Path) -> None:
    """Remove a run directory this invocation created, if it holds no weights."""
    if any(RunPaths(run_dir).weights.glob("*.pt")) or ownership.holder(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
