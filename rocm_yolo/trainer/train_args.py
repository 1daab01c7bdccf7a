"""What a run passes to ``model.train``, and on a resume: where it continues, what changed, which rows go.

Ultralytics' resume reloads the saved arguments and lets only a whitelist of changes
through (:mod:`rocm_yolo.ultralytics_rules.resume`); rocm-yolo's callbacks enforce workers, val
and the presets on the trainer whatever that whitelist holds (:mod:`.callbacks.trainer_settings`).
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.run import devices
from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.midepoch import MidEpochState
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.ultralytics_rules.checkpoint import already_finished, finished
from rocm_yolo.ultralytics_rules.resume import RESUME_REPORTED


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
    target = spec.extended_epochs or epochs  # --resume RUN --epochs N trains on to N
    position = MidEpochState.of(ckpt)  # a mid-epoch checkpoint: "epoch" is the last completed one (-1 in the first)
    if finished(epoch, target, position is not None):
        raise RunFinished(already_finished(spec.run_dir, epochs))
    if not devices.rank():  # rank 0 writes results.csv (of every node's ranks, on several machines)
        trim_results(spec.paths.results, spec.paths.results_backup, epoch + 1, log)
    changed = [f"{k} {saved.get(k)!r} -> {args[k]!r}" for k in RESUME_REPORTED if k in args and saved.get(k) != args[k]]
    where = f"epoch {epoch + 2}/{target}" if position is None else position.describe(target)
    log.event(
        "resume",
        f"resuming {spec.resume} from {where} with profile '{spec.profile}'"
        + (f"; changed: {', '.join(changed)}" if changed else "; settings unchanged"),
        checkpoint=spec.resume,
        epoch=epoch + 2,
        batch=position.batch if position else 0,
        changed=changed,
    )
    # epochs: set on the trainer by its settings callback (Ultralytics' resume would drop it with a warning)
    keep = {k: v for k, v in args.items() if (k in spec.user_keys or k in ("workers", "val")) and k != "epochs"}
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
