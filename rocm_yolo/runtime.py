"""The training child's steps 2-4: environment and presets, the conv patch, and the run.

Kept apart from ``_child.py`` so that module stays a short, ordered list of steps.
``prepare_environment`` must not import torch: it runs before the patches.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rocm_yolo import rocm
from rocm_yolo.heartbeat import write_atomic
from rocm_yolo.log import RunLog
from rocm_yolo.profiles import LoaderSettings
from rocm_yolo.spec import RunSpec

from rocm_yolo.exitcodes import CHILD_FINISHED, CHILD_SETUP_FAILED, OK, USAGE

# Errors Ultralytics raises for bad data or arguments before training starts: not retried.
USER_ERRORS = (FileNotFoundError, NotADirectoryError, ValueError, TypeError, KeyError, SyntaxError)
RESUME_CHANGES = ("workers", "val", "batch", "imgsz", "device")


class RunFinished(ValueError):
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
    strategy, line = convtest.resolve_strategy(env.conv, env.arch, device=device, amp=amp)
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
        f"rocm-yolo {__version__} | profile {spec.profile} | start method spawn | device {device} | attempt {spec.attempt}",
        f"torch {torch.__version__} ({build} build) | ROCm {view.get('hip') or '-'} | "
        f"Ultralytics {ultralytics.__version__} | Python {sys.version.split()[0]}",
        f"loaders: {env.loader.describe()}",
        f"conv: {conv_line}",
    ]
    lines += rocm.header_lines(env.arch, env.presets)
    advice = rocm.override_advice(env.arch, os.environ)
    if advice:
        lines.append(advice)
    lines += list(spec.notes)
    return lines


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
    if epoch is None or epoch < 0 or (epochs and epoch + 1 >= epochs):
        raise RunFinished(
            f"the run in {spec.run_dir} has already finished all {epochs} epochs: nothing to resume "
            "(start a new run without --resume to train again)"
        )
    _trim_results(Path(spec.run_dir) / "results.csv", epoch + 1, log)
    changed = [f"{k} {saved.get(k)!r} -> {args[k]!r}" for k in RESUME_CHANGES if k in args and saved.get(k) != args[k]]
    log.event(
        "resume",
        f"resuming {spec.resume} from epoch {epoch + 2}/{epochs} with profile '{spec.profile}'"
        + (f"; changed: {', '.join(changed)}" if changed else "; settings unchanged"),
        checkpoint=spec.resume,
        epoch=epoch + 2,
        changed=changed,
    )
    # Ultralytics reloads the saved arguments and lets a whitelist through; our callbacks
    # enforce workers, val and the presets on the trainer whatever that whitelist holds.
    keep = {k: v for k, v in args.items() if k in spec.user_keys or k in ("workers", "val")}
    return {**keep, "resume": spec.resume, "save_dir": spec.run_dir}


def _trim_results(csv_path: Path, last_epoch: int, log: RunLog) -> None:
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
        backup = csv_path.with_name("results.before-resume.csv")
        backup.write_text("\n".join(lines) + "\n")
        write_atomic(csv_path, "\n".join(keep) + "\n")
        log.info(f"results.csv: removed {len(dropped)} row(s) after epoch {last_epoch} that this resume trains again "
                 f"(the old file is kept as {backup.name})")


def train(spec: RunSpec, env: Environment, conv_line: str, log: RunLog) -> int:
    from rocm_yolo import faults
    from rocm_yolo.heartbeat import FILENAME, HeartbeatWriter
    from rocm_yolo.integration import RunHooks

    started = time.time()
    heartbeat = HeartbeatWriter(spec.state_dir / FILENAME, attempt=spec.attempt)
    for line in header_lines(spec, env, conv_line):
        log.info(line)

    from ultralytics import YOLO

    hooks = RunHooks(spec, log, arg_presets=env.args)
    groups = [hooks.callbacks(), heartbeat.callbacks()]
    fault = faults.parse(os.environ.get(faults.ENV))
    if fault is not None:
        groups.append(faults.Injector(fault, spec.state_dir).callbacks())
    try:
        model = YOLO(spec.resume or spec.model)
        args = train_args(spec, env, log, model.ckpt)
        for group in groups:
            for event, fn in group.items():
                model.add_callback(event, fn)
        model.train(**args)
    except RunFinished as e:
        _user_error(log, str(e))
        return CHILD_FINISHED
    except Exception as e:
        if hooks.training_started:  # a training error: the supervisor restarts on a safer profile
            _record_crash(spec, log, e)
            raise
        user = _user_error_in_chain(e)
        text = str(user or e).strip()
        message = text.splitlines()[0] if text else e.__class__.__name__
        if user is not None:
            return _user_error(log, message)
        # Before the first batch: a restart on a safer profile would meet the same error.
        import traceback

        traceback.print_exc()
        log.event("setup_error", f"training could not start: {e.__class__.__name__}: {message}", error=message)
        return CHILD_SETUP_FAILED
    log.event("finished", seconds=round(time.time() - started, 2))
    return OK


def _user_error_in_chain(error: BaseException) -> BaseException | None:
    """The user error behind ``error``: Ultralytics wraps e.g. a missing data set's FileNotFoundError
    in a RuntimeError; the innermost such error has the plainest message."""
    found, seen = None, set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, USER_ERRORS):
            found = error
        error = error.__cause__ or error.__context__
    return found


def _record_crash(spec: RunSpec, log: RunLog, error: BaseException) -> None:
    """Keep the traceback of a training error in the run directory (the terminal scrolls away)."""
    import traceback

    path = Path(spec.run_dir) / f"crash-{spec.attempt}.txt"
    try:
        path.write_text("".join(traceback.format_exception(error)))
    except OSError:
        return
    first = (str(error).strip().splitlines() or [error.__class__.__name__])[0]
    log.event("crash_traceback", f"training error: {error.__class__.__name__}: {first} (traceback in {path})",
              path=str(path), error=first)


def _user_error(log: RunLog, message: str) -> int:
    print(f"rocm-yolo: error: {message}", file=sys.stderr, flush=True)
    log.event("user_error", error=message)
    return USAGE
