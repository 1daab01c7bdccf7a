"""The training child's steps 2-4: set up, then ``YOLO(model).train(**args)`` with rocm-yolo's callbacks.

A failure during training (:func:`report_training_failure`) is one line and an exit code: a full or read-only disk
stops the run, a rocm-yolo bug is reported as one, and anything else is a crash (1, ``RUN/crash-K.txt``) the
supervisor restarts on a safer profile. One before training is the caller's to report
(:func:`rocm_yolo.setup_failure.report_setup_failure`), as the DDP launcher's is.
"""

from __future__ import annotations

import time

from rocm_yolo import errors, triage
from rocm_yolo.errors import CHILD_FINISHED, OK
from rocm_yolo.policy.placement import relayout
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import devices, hooks, weights
from rocm_yolo.run.devices import Relayout
from rocm_yolo.run.midepoch_state import MID_EPOCH_KEY, parse_interval
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.setup_failure import report_setup_failure, say_setup_error, say_user_error
from rocm_yolo.trainer import train_args
from rocm_yolo.trainer.setup import Environment, header_lines, setup


def setup_and_train(spec: RunSpec, log: RunLog) -> int:
    """Set up (raising for errors before training: the caller reports them), then train."""
    env = setup(spec, log)  # 2.-3.
    return train(spec, env, log)  # 4.


def callback_owners(spec: RunSpec, env: Environment, log: RunLog):
    """rocm-yolo's callback owners in the order they run, and the trainer's settings among them."""
    from rocm_yolo.trainer.callbacks.good_copy import GoodCopy
    from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter
    from rocm_yolo.trainer.callbacks.trackers import Trackers
    from rocm_yolo.trainer.callbacks.trainer_settings import TrainerSettings
    from rocm_yolo.trainer.forkserver.server import ServerReady
    from rocm_yolo.trainer.midepoch.relayout import Relaid
    from rocm_yolo.trainer.midepoch.restore import MidEpochResume
    from rocm_yolo.trainer.midepoch.sample_order import TrainOrder
    from rocm_yolo.trainer.midepoch.save import MidEpochSave
    from rocm_yolo.ultralytics_rules import compat

    paths = spec.paths
    rank = devices.rank() or 0  # a multi-GPU run's rank; rank 0 (and a one-GPU run) writes the run's files
    local = devices.local_rank() or 0  # local rank 0 speaks for its node (the run, on one machine)
    heartbeat = HeartbeatWriter(
        paths.heartbeat_of(rank if local else 0),
        attempt=spec.attempt,
        on_error=lambda message: log.event("heartbeat_error", message),
        rank=rank,
        local_rank=local,
        spawned_workers=bool(env.loader.workers) and env.loader.start_method == "spawn",
        world=devices.world_now(),
    )
    settings = TrainerSettings(spec, log, arg_presets=env.args)
    testing = hooks.trainer_callbacks(paths, spec.attempt)  # [] unless a test asked for faults or a recording
    relaid = relayout_here(spec)
    order = TrainOrder(log, relaid, gpu=rank)
    requested = {k: spec.train_args[k] for k in ("batch", "imgsz") if k in spec.train_args}
    save = MidEpochSave(paths, log, parse_interval(spec.checkpoint_every), order, requested=requested)
    good_copy = GoodCopy(log, on_verified=(save.verified,) if rank == 0 else ())
    listeners = [heartbeat.resumed_at, save.resumed_at] + [t.resumed_at for t in testing if hasattr(t, "resumed_at")]
    mid_resume = MidEpochResume(
        log, order, on_resumed=tuple(listeners), supported=lambda: not compat.missing_for(compat.MID_EPOCH_FEATURE)
    )
    # the mid-epoch ones last: a resumed epoch moves the others' batch counters after they reset them
    writers = [save] if rank == 0 else []  # the other ranks resume from rank 0's checkpoints, and write none
    trackers = [Trackers(spec, log)] if rank == 0 else []  # Ultralytics' tracker callbacks run in rank 0 only
    ready = ServerReady(spec.run_dir)  # before the heartbeat says "first batch": the server's imports are start-up
    # on other GPUs than the run's: after the mid-epoch resume, which installs the order laid over the run's ranks
    laid = [Relaid(relaid, order, log)] if relaid is not None and relaid.changed else []
    return [settings, good_copy, ready, heartbeat, *testing, *writers, mid_resume, *laid, *trackers], settings


def relayout_here(spec: RunSpec) -> Relayout | None:
    """The run's layout on the GPUs this attempt has now (torch's ``WORLD_SIZE`` in a rank), when it is known."""
    layout = spec.run_layout
    if layout is None:
        return None
    gpus = devices.world_now()
    return relayout(layout, gpus, f"{gpus} GPU{'s' if gpus > 1 else ''} now")


def train(spec: RunSpec, env: Environment, log: RunLog) -> int:
    from rocm_yolo.trainer.callbacks.registry import register
    from rocm_yolo.trainer.midepoch.restore import checked_resume
    from rocm_yolo.trainer.midepoch.save import clean_temporaries

    started = time.time()
    owners, settings = callback_owners(spec, env, log)  # the heartbeat says "setup" from here on
    rank = devices.rank()
    if not devices.local_rank():  # the run's header: one per run (per node), not one per rank
        for line in header_lines(spec, env):
            log.info(line)

    from ultralytics import YOLO

    if not rank:
        clean_temporaries(spec.paths)  # half-written files of a checkpoint write that was killed
    model = None
    try:
        if rank is not None:
            from rocm_yolo.trainer.rank import agreed_resume

            spec = agreed_resume(spec, log)  # more than one machine: the checkpoint every rank of every node finds
        model = YOLO(spec.resume or spec.model)
        if spec.resume:
            spec, model = checked_resume(spec, model, log, YOLO)
            model = train_args.reopen_stripped(spec, model, log, YOLO)  # a finished run trained on, from last.pt
        args = train_args.train_args(spec, env.args, log, model.ckpt)
        relaid = relayout_here(spec)
        if relaid is not None:  # Ultralytics' per-rank share is the GPU's micro-batch (a checkpoint of an attempt
            args["batch"] = relaid.train_batch  # on other GPUs holds that attempt's batch: not the run's own)
        if model.ckpt:
            model.ckpt.pop(MID_EPOCH_KEY, None)  # the trainer loads its own copy; do not hold this one all run
        register(model, owners)
        if rank is not None:
            from rocm_yolo.trainer.rank import trainer_class

            args["trainer"] = trainer_class(model, spec.nodes.count if spec.nodes else 1)
        model.train(**args)
    except train_args.RunFinished as e:
        say_user_error(log, str(e))
        return CHILD_FINISHED
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        if not settings.training_started:
            raise  # the child reports it: user, environment or internal, never retried
        trainer = getattr(model, "trainer", None)
        loaders = (
            getattr(trainer, "train_loader", None),
            getattr(getattr(trainer, "validator", None), "dataloader", None),
        )
        return report_training_failure(
            spec,
            log,
            name_dead_worker(e, [x for x in loaders if x is not None]),
            batch=getattr(trainer, "batch_size", None),  # Ultralytics may have halved it after out-of-memory errors
        )
    log.event("trained", seconds=round(time.time() - started, 2))  # the run's "finished" is the supervisor's
    return OK


# Exceptions that mean a programming error when rocm-yolo's own code raised them.
BUG_TYPES = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError, UnboundLocalError)


def _drop_truncated(spec: RunSpec, log: RunLog) -> None:
    """A save cut short by a full disk leaves a truncated checkpoint: it can never load, so remove it."""
    for path in (spec.paths.last, spec.paths.best):
        reason = weights.verify(path) if path.exists() else None
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
        return say_setup_error(spec, log, error, triage.classify(error).line)
    if isinstance(error, BUG_TYPES) and triage.raised_by_rocm_yolo(error):
        return report_setup_failure(spec, log, error)  # classified internal: not retried
    path = errors.save_traceback(error, spec.paths.crash(spec.attempt, devices.rank()))
    first = errors.one_line(error)
    log.event(
        "crash_traceback",
        f"training error: {first}" + (f" (traceback in {path})" if path else ""),
        path=str(path) if path else None,
        error=first,
        batch=batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
    )
    return errors.FAILED
