"""Every way the training child fails, as one line and an exit code the supervisor acts on.

Before training (:func:`report_setup_failure`) nothing is retried: a user error (2), a broken
environment (4, the traceback in ``RUN/setup-K.txt``) or a rocm-yolo bug (123, in
``RUN/internal-K.txt``). During training (:func:`report_training_failure`) a full or
read-only disk stops the run, a rocm-yolo bug is reported as one, and anything else is a
crash (1, ``RUN/crash-K.txt``) the supervisor restarts on a safer profile.
"""

from __future__ import annotations

from rocm_yolo import errors, triage
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.run import checkpoints
from rocm_yolo.run.devices import rank
from rocm_yolo.run.events import RunLog
from rocm_yolo.run.spec import RunSpec

# Exceptions that mean a programming error when rocm-yolo's own code raised them.
BUG_TYPES = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError, UnboundLocalError)


def say_user_error(log: RunLog, message: str) -> int:
    log.event("user_error", f"error: {message}", error=message)
    return errors.USAGE


def _say_setup_error(spec: RunSpec, log: RunLog, error: BaseException, reason: str) -> int:
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
        return _say_setup_error(spec, log, error, found.line)
    code = errors.report_internal(error, spec.paths.internal_error(spec.attempt, rank()))
    log.event("internal_error", error=found.line, path=str(spec.paths.internal_error(spec.attempt, rank())))
    return code


def _drop_truncated(spec: RunSpec, log: RunLog) -> None:
    """A save cut short by a full disk leaves a truncated checkpoint: it can never load, so remove it."""
    for path in (spec.paths.last, spec.paths.best):
        reason = checkpoints.verify(path) if path.exists() else None
        if reason is not None:
            try:
                path.unlink()
                log.info(f"removed {path}: its save was cut short ({reason})")
            except OSError:
                pass


def name_dead_worker(error: BaseException, loaders: list) -> BaseException:
    """A data queue that failed because a worker died, reported as torch reports it (with the pid).

    See :func:`rocm_yolo.patches.loaders.dataloader.dead_workers`: a worker killed while it hands over a
    batch can surface as a bare ``ConnectionResetError`` or ``EOFError`` that names no worker.
    """
    if not isinstance(error, (ConnectionError, EOFError)) or not loaders:
        return error
    from rocm_yolo.patches.loaders.dataloader import dead_workers

    dead = dead_workers(loaders)
    if not dead:
        return error
    how = ", ".join(
        f"pid {pid} " + (f"killed by {signal_name(-code)}" if code is not None and code < 0 else f"exit code {code}")
        for pid, code in dead
    )
    pids = ", ".join(str(pid) for pid, _ in dead)
    named = RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly: {how}")
    named.__cause__ = error
    return named


def report_training_failure(spec: RunSpec, log: RunLog, error: BaseException, batch: int | None = None) -> int:
    """An error during training: a full or read-only disk stops the run, a rocm-yolo bug is
    reported as one, anything else is a crash the supervisor restarts on a safer profile (``batch``: the batch size
    the trainer had then, which the supervisor's out-of-memory advice starts from)."""
    if triage.is_disk_error(error):
        _drop_truncated(spec, log)  # frees the space they hold for the reports that follow
        return _say_setup_error(spec, log, error, triage.classify(error).line)
    if isinstance(error, BUG_TYPES) and triage.raised_by_rocm_yolo(error):
        return report_setup_failure(spec, log, error)  # classified internal: not retried
    path = errors.save_traceback(error, spec.paths.crash(spec.attempt, rank()))
    first = errors.one_line(error)
    log.event(
        "crash_traceback",
        f"training error: {first}" + (f" (traceback in {path})" if path else ""),
        path=str(path) if path else None,
        error=first,
        batch=batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
    )
    return errors.FAILED
