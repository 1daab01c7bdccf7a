"""A child's failure before its work starts, as one line and an exit code the supervisor acts on: what the training
child and the DDP launcher both need (torch-free; they are the supervisor's children, started with ``SPEC.json``).

Nothing here is retried: a user error (2), a broken environment (4, the traceback in ``RUN/setup-K.txt``) or a
rocm-yolo bug (123, in ``RUN/internal-K.txt``), as :func:`rocm_yolo.triage.classify` decides. A full or read-only
disk during training is the environment's too (:func:`say_setup_error`, from the trainer's
:func:`rocm_yolo.trainer.training.report_training_failure`).
"""

from __future__ import annotations

from rocm_yolo import errors, triage
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.devices import rank
from rocm_yolo.run.spec import RunSpec


def say_user_error(log: RunLog, message: str) -> int:
    log.event("user_error", f"error: {message}", error=message)
    return errors.USAGE


def say_setup_error(spec: RunSpec, log: RunLog, error: BaseException, reason: str) -> int:
    """An environment error (``reason``: its line): said, its traceback kept in ``RUN/setup-K.txt``; never retried."""
    saved = errors.save_traceback(error, spec.paths.setup_error(spec.attempt, rank()))
    where = f" (details in {saved})" if saved else ""
    log.event(
        "setup_error",
        f"environment error: {reason}{where}; not retrying",
        error=reason,
        path=str(saved) if saved else None,
    )
    return errors.SETUP


def report_setup_failure(spec: RunSpec, log: RunLog, error: BaseException) -> int:
    """An error before training started: one line, an exit code; never retried."""
    found = triage.classify(error)
    if found.kind == triage.USER:
        return say_user_error(log, found.line)
    if found.kind == triage.ENVIRONMENT:
        return say_setup_error(spec, log, error, found.line)
    code = errors.report_internal(error, spec.paths.internal_error(spec.attempt, rank()))
    log.event("internal_error", error=found.line, path=str(spec.paths.internal_error(spec.attempt, rank())))
    return code
