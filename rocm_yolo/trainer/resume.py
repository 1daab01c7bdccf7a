"""What a run passes to ``model.train``, and on a resume: where it continues, what changed, which rows go.

Ultralytics' resume reloads the saved arguments and lets only a whitelist of changes
through; rocm-yolo's callbacks enforce workers, val and the presets on the trainer whatever
that whitelist holds (:mod:`.run_hooks`).
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.run import checkpoints
from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.checkpoints import MID_EPOCH_KEY
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.ultralytics_rules.checkpoint import finished

RESUME_CHANGES = ("workers", "val", "batch", "imgsz", "device")


class RunFinished(UsageError):
    """The checkpoint to resume belongs to a run that has already trained all its epochs."""


def train_args(spec: RunSpec, presets: dict, log: RunLog, ckpt: dict | None = None) -> dict:
    """The arguments for ``model.train``. On resume, checks the checkpoint (the dict Ultralytics
    already loaded for ``YOLO(last.pt)``) and logs what changed.

    Raises :class:`RunFinished` for a run that has already trained all its epochs.
    """
    args = {**spec.train_args, "workers": spec.loader.workers, "val": spec.val, **presets}
    if not spec.resume:
        return args
    ckpt = ckpt or {}
    saved = dict(ckpt.get("train_args") or {})
    epoch, epochs = ckpt.get("epoch", -1), saved.get("epochs")
    position = ckpt.get(MID_EPOCH_KEY)  # a mid-epoch checkpoint: "epoch" is the last completed one (-1 in the first)
    if finished(epoch, epochs, position is not None):
        raise RunFinished(
            f"the run in {spec.run_dir} has already finished all {epochs} epochs: nothing to resume "
            "(start a new run without --resume to train again)"
        )
    trim_results(spec.paths.results, spec.paths.results_backup, epoch + 1, log)
    changed = [f"{k} {saved.get(k)!r} -> {args[k]!r}" for k in RESUME_CHANGES if k in args and saved.get(k) != args[k]]
    where = (
        f"epoch {epoch + 2}/{epochs}"
        if position is None
        else f"epoch {position['epoch'] + 1}/{epochs}, batch {position['batch']:,}/{position['batches']:,}"
    )
    log.event(
        "resume",
        f"resuming {spec.resume} from {where} with profile '{spec.profile}'"
        + (f"; changed: {', '.join(changed)}" if changed else "; settings unchanged"),
        checkpoint=spec.resume,
        epoch=epoch + 2,
        batch=position["batch"] if position else 0,
        changed=changed,
    )
    keep = {k: v for k, v in args.items() if k in spec.user_keys or k in ("workers", "val")}
    return {**keep, "resume": spec.resume, "save_dir": spec.run_dir}


def trim_results(csv_path: Path, backup: Path, last_epoch: int, log: RunLog) -> None:
    """Drop results.csv rows after ``last_epoch`` (1-based): the resume trains those epochs again.

    They exist when a run stopped between Ultralytics' ``save_metrics`` and ``save_model``, or
    when resuming from the verified copy of an older checkpoint.
    """
    try:
        lines = csv_path.read_text().splitlines()
    except OSError:
        return
    if len(lines) < 2:
        return
    keep, dropped = [lines[0]], []
    for line in lines[1:]:
        try:
            epoch = int(float(line.split(",", 1)[0]))
        except ValueError:
            epoch = 0
        (dropped if epoch > last_epoch else keep).append(line)
    if dropped:
        write_atomic(backup, "\n".join(lines) + "\n")
        write_atomic(csv_path, "\n".join(keep) + "\n")
        log.info(
            f"results.csv: removed {len(dropped)} row(s) after epoch {last_epoch} that this resume trains again "
            f"(the old file is kept as {backup.name})"
        )


def continue_mid_epoch(spec: RunSpec, model, log: RunLog, load) -> tuple[RunSpec, object]:
    """Check that the mid-epoch checkpoint ``spec`` resumes can continue inside its epoch here; if not (another
    batch or imgsz, or an Ultralytics without the internals it needs), resume from the end of the last epoch."""
    from rocm_yolo.trainer import compat
    from rocm_yolo.trainer.checkpoint_state import FORMAT, position_mismatch

    given = {k: spec.train_args[k] for k in ("batch", "imgsz") if k in spec.user_keys and k in spec.train_args}
    state = (model.ckpt or {}).get(MID_EPOCH_KEY)
    if isinstance(state, dict) and state.get("format") != FORMAT:
        why = f"it was written by another rocm-yolo (position format {state.get('format')}, this one reads {FORMAT})"
    else:
        why = position_mismatch(model.ckpt, given)
    if why is None and MID_EPOCH_KEY in (model.ckpt or {}) and compat.missing_for(compat.MID_EPOCH_FEATURE):
        why = "this Ultralytics cannot be continued inside an epoch"
    if why is None:
        return spec, model
    name = Path(spec.resume).name
    try:
        path, note = checkpoints.choose_resume(spec.paths.last)
    except UsageError:
        raise UsageError(
            f"{why}: the mid-epoch checkpoint {name} cannot continue with that, and the run has no "
            "end-of-epoch checkpoint yet: resume with the run's batch and imgsz, or start a new run"
        ) from None
    if note:
        log.info(note)
    log.event(
        "resume_epoch_boundary",
        f"{why}: the position in {name} means nothing with that, so the run resumes "
        f"from the end of its last epoch ({path.name})",
        reason=why,
        checkpoint=str(path),
    )
    return spec.with_changes(resume=str(path)), load(str(path))
