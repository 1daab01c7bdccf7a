"""The training child's steps 2-4: environment and presets, checked imports, the patches, the run.

Kept apart from ``_child.py`` so that module stays a short, ordered list of steps.
``prepare_environment`` must not import torch: it runs before the patches. Every failure
ends here as one line and an exit code (:func:`report_setup_failure` before training,
:func:`report_training_failure` during it).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rocm_yolo import checkpoints, errors, rocm
from rocm_yolo.checkpoints import MID_EPOCH_KEY
from rocm_yolo.errors import CHILD_FINISHED, OK, SetupError, UsageError
from rocm_yolo.fsutil import write_atomic
from rocm_yolo.log import RunLog
from rocm_yolo.profiles import LoaderSettings
from rocm_yolo.spec import RunSpec

RESUME_CHANGES = ("workers", "val", "batch", "imgsz", "device")
# Exceptions that mean a programming error when rocm-yolo's own code raised them.
BUG_TYPES = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError, UnboundLocalError)


class RunFinished(UsageError):
    """The checkpoint to resume belongs to a run that has already trained all its epochs."""


@dataclass
class Environment:
    arch: str | None
    presets: list = field(default_factory=list)
    loader: LoaderSettings | None = None
    args: dict = field(default_factory=dict)  # train-argument presets (e.g. amp=False on gfx1010)
    conv: str = "native"  # requested conv strategy after presets ("auto" resolved later)


def prepare_environment(spec: RunSpec, environ=os.environ) -> Environment:
    """Apply the profile's variables and the architecture's presets where the user set nothing."""
    for key, value in spec.env.items():
        environ.setdefault(key, value)
    arch = rocm.detect_arch()
    user_args = {k: spec.conv if k == "conv" else spec.train_args.get(k, True) for k in spec.user_keys}
    found = rocm.presets(arch, user_args, environ)
    env = Environment(arch=arch, presets=found, loader=spec.loader, conv=spec.conv)
    for p in found:
        if p.user_set:
            continue
        if p.kind == "env":
            environ[p.key] = str(p.value)
            if p.key.startswith("MIOPEN_") and p.key.endswith(("_PATH", "_DIR")):
                os.makedirs(str(p.value), exist_ok=True)
        elif p.kind == "tool" and p.key == "conv":
            env.conv = str(p.value)
        elif p.kind == "arg":
            env.args[p.key] = p.value
        elif p.kind == "loader" and p.key in LoaderSettings.__dataclass_fields__:
            env.loader = replace(env.loader, **{p.key: p.value})
    return env


def install_conv(spec: RunSpec, env: Environment) -> str:
    """Resolve ``--conv`` (``auto`` runs the self-test on ROCm) and install it; the header line."""
    from rocm_yolo import convtest
    from rocm_yolo.patches import conv as conv_patch

    device = "cpu" if str(spec.train_args.get("device")) == "cpu" else "cuda"
    amp = env.args.get("amp", spec.train_args.get("amp", True)) not in (False, "fp32")
    try:
        strategy, line = convtest.resolve_strategy(env.conv, env.arch, device=device, amp=amp)
    except convtest.SelfTestError as e:  # a restart would find none either
        raise SetupError(f"no working Conv2d strategy: {e}") from e
    if strategy != "native":
        conv_patch.install(strategy)
    env.conv = strategy
    return line


def header_lines(spec: RunSpec, env: Environment, conv_line: str) -> list[str]:
    import torch
    import ultralytics

    from rocm_yolo import __version__
    view = rocm.torch_view()
    build = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    device = spec.train_args.get("device") or "auto"
    lines = [
        f"rocm-yolo {__version__} | profile {spec.profile} | start method {_start_method(env.loader)} | device {device} "
        f"| attempt {spec.attempt}",
        f"torch {torch.__version__} ({build} build) | ROCm {view.get('hip') or '-'} | "
        f"Ultralytics {ultralytics.__version__} | Python {sys.version.split()[0]}",
        f"loaders: {env.loader.describe()}",
        f"conv: {conv_line}",
    ]
    lines += rocm.header_lines(env.arch, env.presets)
    advice = rocm.override_advice(env.arch, os.environ)
    if advice:
        lines.append(advice)
    return lines


def _start_method(loader: LoaderSettings) -> str:
    if not loader.workers:
        return "- (no worker process)"
    return "forkserver (preloaded)" if loader.start_method == "forkserver" else loader.start_method


def train_args(spec: RunSpec, env: Environment, log: RunLog, ckpt: dict | None = None) -> dict:
    """The arguments for ``model.train``. On resume, checks the checkpoint (the dict Ultralytics
    already loaded for ``YOLO(last.pt)``) and logs what changed.

    Raises :class:`RunFinished` for a run that has already trained all its epochs.
    """
    args = {**spec.train_args, "workers": spec.loader.workers, "val": spec.val, **env.args}
    if not spec.resume:
        return args
    ckpt = ckpt or {}
    saved = dict(ckpt.get("train_args") or {})
    epoch, epochs = ckpt.get("epoch", -1), saved.get("epochs")
    position = ckpt.get(MID_EPOCH_KEY)  # a mid-epoch checkpoint: "epoch" is the last completed one (-1 in the first)
    if position is None and (epoch is None or epoch < 0 or (epochs and epoch + 1 >= epochs)):
        raise RunFinished(
            f"the run in {spec.run_dir} has already finished all {epochs} epochs: nothing to resume "
            "(start a new run without --resume to train again)"
        )
    _trim_results(spec.paths.results, spec.paths.results_backup, epoch + 1, log)
    changed = [f"{k} {saved.get(k)!r} -> {args[k]!r}" for k in RESUME_CHANGES if k in args and saved.get(k) != args[k]]
    where = (f"epoch {epoch + 2}/{epochs}" if position is None else
             f"epoch {position['epoch'] + 1}/{epochs}, batch {position['batch']:,}/{position['batches']:,}")
    log.event(
        "resume",
        f"resuming {spec.resume} from {where} with profile '{spec.profile}'"
        + (f"; changed: {', '.join(changed)}" if changed else "; settings unchanged"),
        checkpoint=spec.resume,
        epoch=epoch + 2,
        batch=position["batch"] if position else 0,
        changed=changed,
    )
    # Ultralytics reloads the saved arguments and lets a whitelist through; our callbacks
    # enforce workers, val and the presets on the trainer whatever that whitelist holds.
    keep = {k: v for k, v in args.items() if k in spec.user_keys or k in ("workers", "val")}
    return {**keep, "resume": spec.resume, "save_dir": spec.run_dir}


def _trim_results(csv_path: Path, backup: Path, last_epoch: int, log: RunLog) -> None:
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
        log.info(f"results.csv: removed {len(dropped)} row(s) after epoch {last_epoch} that this resume trains again "
                 f"(the old file is kept as {backup.name})")


def import_checked(name: str, what: str):
    """Import ``name``; a failure of any kind is a broken environment, named as such."""
    try:
        return importlib.import_module(name)
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise SetupError(f"{name} cannot be imported ({errors.one_line(e)}): {what}; "
                         "'rocm-yolo doctor' shows more") from e


def run(spec: RunSpec, log: RunLog) -> int:
    """Steps 2-4 of the child; raises for errors before training (the caller reports them)."""
    env = prepare_environment(spec)  # 2. profile variables and architecture presets (no torch yet)
    if env.loader.workers and env.loader.start_method == "forkserver":
        from rocm_yolo import forkserver

        forkserver.start(spec.run_dir)  # imports torch and Ultralytics while the trainer does the same
    import_checked("torch", "reinstall torch (on an AMD GPU, the ROCm build)")  # 3.
    import_checked("ultralytics", "reinstall ultralytics")
    from rocm_yolo import compat

    for warning in compat.check():  # essential internals missing: SetupError; others: a feature is off
        log.event("compat", warning, warning=warning)
    from rocm_yolo.patches import dataloader as loader_patch

    loader_patch.install(env.loader, spec.run_dir)
    conv_line = install_conv(spec, env)
    return train(spec, env, conv_line, log)  # 4.


def continue_mid_epoch(spec: RunSpec, model, log: RunLog, load) -> tuple[RunSpec, object]:
    """Check that the mid-epoch checkpoint ``spec`` resumes can continue inside its epoch here; if not (another
    batch or imgsz, or an Ultralytics without the internals it needs), resume from the end of the last epoch."""
    from rocm_yolo import compat
    from rocm_yolo.midepoch import position_mismatch

    given = {k: spec.train_args[k] for k in ("batch", "imgsz") if k in spec.user_keys and k in spec.train_args}
    why = position_mismatch(model.ckpt, given)
    if why is None and MID_EPOCH_KEY in (model.ckpt or {}) and compat.missing_for(compat.MID_EPOCH_FEATURE):
        why = "this Ultralytics cannot be continued inside an epoch"
    if why is None:
        return spec, model
    name = Path(spec.resume).name
    try:
        path, note = checkpoints.choose_resume(spec.paths.last)
    except UsageError:
        raise UsageError(f"{why}: the mid-epoch checkpoint {name} cannot continue with that, and the run has no "
                         "end-of-epoch checkpoint yet: resume with the run's batch and imgsz, or start a new run") from None
    if note:
        log.info(note)
    log.event("resume_epoch_boundary", f"{why}: the position in {name} means nothing with that, so the run resumes "
              f"from the end of its last epoch ({path.name})", reason=why, checkpoint=str(path))
    return spec.with_changes(resume=str(path)), load(str(path))


def train(spec: RunSpec, env: Environment, conv_line: str, log: RunLog) -> int:
    from rocm_yolo import faults
    from rocm_yolo.heartbeat import HeartbeatWriter
    from rocm_yolo.integration import RunHooks
    from rocm_yolo.midepoch import MidEpochCheckpoints, clean_temporaries

    started = time.time()
    paths = spec.paths
    heartbeat = HeartbeatWriter(paths.heartbeat, attempt=spec.attempt,
                                on_error=lambda message: log.event("heartbeat_error", message))
    for line in header_lines(spec, env, conv_line):
        log.info(line)

    from ultralytics import YOLO

    from rocm_yolo.compat import callbacks_of

    hooks = RunHooks(spec, log, arg_presets=env.args)
    groups = [callbacks_of(hooks), callbacks_of(heartbeat)]
    injected = faults.active()
    listeners = [heartbeat.resumed_at]
    if injected:
        injector = faults.Injector(injected, paths)
        groups.append(callbacks_of(injector))
        listeners.append(injector.resumed_at)
    requested = {k: spec.train_args[k] for k in ("batch", "imgsz") if k in spec.train_args}
    midepoch = MidEpochCheckpoints(paths, log, checkpoints.parse_interval(spec.checkpoint_every), attempt=spec.attempt,
                                   on_resumed=tuple(listeners), saved_epoch=lambda: hooks.verified_epoch,
                                   requested=requested)
    groups.append(callbacks_of(midepoch))  # last: it moves the others' batch counters on a resumed epoch
    clean_temporaries(paths)  # half-written files of a checkpoint write that was killed
    try:
        model = YOLO(spec.resume or spec.model)
        if spec.resume:
            spec, model = continue_mid_epoch(spec, model, log, YOLO)
        args = train_args(spec, env, log, model.ckpt)
        if model.ckpt:
            model.ckpt.pop(MID_EPOCH_KEY, None)  # the trainer loads its own copy; do not hold this one all run
        for group in groups:
            for event, fn in group.items():
                model.add_callback(event, fn)
        model.train(**args)
    except RunFinished as e:
        _say_user_error(log, str(e))
        return CHILD_FINISHED
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        if not hooks.training_started:
            raise  # _child reports it: user, environment or internal, never retried
        trainer = getattr(model, "trainer", None)
        loaders = (getattr(trainer, "train_loader", None), getattr(getattr(trainer, "validator", None), "dataloader", None))
        return report_training_failure(spec, log, _name_dead_worker(e, [x for x in loaders if x is not None]))
    log.event("finished", seconds=round(time.time() - started, 2))
    return OK


# --------------------------------------------------------------------------- reporting


def _say_user_error(log: RunLog, message: str) -> int:
    log.event("user_error", f"error: {message}", error=message)
    return errors.USAGE


def _say_setup_error(spec: RunSpec, log: RunLog, error: BaseException, reason: str) -> int:
    saved = errors.save_traceback(error, spec.paths.setup_error(spec.attempt))
    where = f" (details in {saved})" if saved else ""
    log.event("setup_error", f"environment error: {reason}{where}; not retrying", error=reason,
              path=str(saved) if saved else None)
    return errors.SETUP


def report_setup_failure(spec: RunSpec, log: RunLog, error: BaseException) -> int:
    """An error before training started: one line, an exit code; never retried."""
    found = errors.classify(error)
    if found.kind == errors.USER:
        return _say_user_error(log, found.line)
    if found.kind == errors.ENVIRONMENT:
        return _say_setup_error(spec, log, error, found.line)
    code = errors.report_internal(error, spec.paths.internal_error(spec.attempt))
    log.event("internal_error", error=found.line, path=str(spec.paths.internal_error(spec.attempt)))
    return code


def _drop_truncated(spec: RunSpec, log: RunLog) -> None:
    """A save cut short by a full disk leaves a truncated checkpoint: it can never load, so remove it."""
    from rocm_yolo import checkpoints

    for path in (spec.paths.last, spec.paths.best):
        reason = checkpoints.verify(path) if path.exists() else None
        if reason is not None:
            try:
                path.unlink()
                log.info(f"removed {path}: its save was cut short ({reason})")
            except OSError:
                pass


def _raised_by_rocm_yolo(error: BaseException) -> bool:
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and any(f"{os.sep}{pkg}{os.sep}" in frames[-1].filename for pkg in ("rocm_yolo", "patches"))


def _name_dead_worker(error: BaseException, loaders: list) -> BaseException:
    """A data queue that failed because a worker died, reported as torch reports it (with the pid).

    See :func:`patches.dataloader.dead_workers`: a worker killed while it hands over a batch can
    surface as a bare ``ConnectionResetError`` or ``EOFError`` that names no worker.
    """
    if not isinstance(error, (ConnectionError, EOFError)) or not loaders:
        return error
    from rocm_yolo.patches.dataloader import dead_workers

    dead = dead_workers(loaders)
    if not dead:
        return error
    from rocm_yolo.proctree import signal_name

    how = ", ".join(f"pid {pid} " + (f"killed by {signal_name(-code)}" if code is not None and code < 0
                                     else f"exit code {code}") for pid, code in dead)
    pids = ", ".join(str(pid) for pid, _ in dead)
    named = RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly: {how}")
    named.__cause__ = error
    return named


def report_training_failure(spec: RunSpec, log: RunLog, error: BaseException) -> int:
    """An error during training: a full or read-only disk stops the run, a rocm-yolo bug is
    reported as one, anything else is a crash the supervisor restarts on a safer profile."""
    if errors.is_disk_error(error):
        _drop_truncated(spec, log)  # frees the space they hold for the reports that follow
        return _say_setup_error(spec, log, error, errors.classify(error).line)
    if isinstance(error, BUG_TYPES) and _raised_by_rocm_yolo(error):
        return report_setup_failure(spec, log, error)  # classified internal: not retried
    path = errors.save_traceback(error, spec.paths.crash(spec.attempt))
    first = errors.one_line(error)
    log.event("crash_traceback", f"training error: {first}" + (f" (traceback in {path})" if path else ""),
              path=str(path) if path else None, error=first)
    return errors.FAILED
