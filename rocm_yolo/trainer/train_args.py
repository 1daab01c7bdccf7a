"""What a run passes to ``model.train``, and on a resume: where it continues, what changed, which rows go.

Ultralytics' resume reloads the saved arguments and lets only a whitelist of changes
through (:mod:`rocm_yolo.ultralytics_rules.resume`); rocm-yolo's callbacks enforce workers, val
and the presets on the trainer whatever that whitelist holds (:mod:`.callbacks.trainer_settings`).
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import devices
from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.midepoch_state import MidEpochState
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.ultralytics_rules.checkpoint import already_finished, finished, last_epoch
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


def reopen_stripped(spec: RunSpec, model, log: RunLog, load):
    """``--resume RUN --epochs N`` of a run whose end of training stripped ``last.pt`` (no optimizer, ``epoch`` -1,
    which Ultralytics' resume refuses): ``last.pt`` again as an end-of-epoch save Ultralytics resumes, made from it:
    its weights as the EMA, the epochs trained (``results.csv``), the best fitness, early-stopping state and EMA
    updates the end of training kept in it (:mod:`rocm_yolo.patches.saves.final_save`), and no optimizer (Ultralytics
    builds a new one). Written atomically; the model loaded from it. Any other resume: ``model`` as it is."""
    ckpt = model.ckpt or {}
    epoch = ckpt.get("epoch")
    if spec.extended_epochs is None or not isinstance(epoch, int) or epoch >= 0 or MidEpochState.of(ckpt) is not None:
        return model
    import torch

    trained = last_epoch(spec.paths.results) or (ckpt.get("train_args") or {}).get("epochs") or 1
    reopened = {
        **ckpt,
        "epoch": trained - 1,
        "model": None,
        "ema": ckpt.get("ema") or ckpt["model"],
        "updates": ckpt.get("updates") or 0,
        "optimizer": None,
        "scaler": None,
    }
    write_atomic(spec.resume, lambda f: torch.save(reopened, f), durable=True)
    log.info(
        f"{Path(spec.resume).name}: the weights of epoch {trained}, with a new optimizer (the end of training "
        "stripped the run's)"
    )
    return load(spec.resume)


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
