"""Turning user input into a RunSpec, and running it under the supervisor.

Shared by the CLI and the Python API (``rocm_yolo.train``), so both validate the same way
and run the same child process. Nothing here imports torch or ultralytics.
"""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Mapping

from rocm_yolo import checkpoints, ownership, ucfg
from rocm_yolo.conv_strategies import CHOICES as CONV_STRATEGIES
from rocm_yolo.errors import UsageError
from rocm_yolo.paths import RunPaths
from rocm_yolo.profiles import DEFAULT_LADDER, DEFAULT_PROFILE, LOADER_KEYS, resolve
from rocm_yolo.spec import RunSpec, latest_spec
from rocm_yolo.supervisor import RunResult, State, Supervisor, WatchdogConfig
from rocm_yolo.tasks import CLASSIFY, task_for_model

# Flags that are also Ultralytics train arguments (KEY=VALUE may not set them a second time).
FLAG_KEYS = ("model", "workers", "epochs", "imgsz", "batch", "device", "project", "name")
NOT_KEYS = {"mode": "rocm-yolo always trains", "task": "the task follows the model", "resume": "use --resume [LAST_PT]"}
DEMO_DEFAULTS = {"imgsz": 64, "batch": 8, "plots": False}  # sized for a CPU: 2 epochs in well under a minute


def parse_key_values(items: list[str]) -> dict[str, Any]:
    """``["epochs=3", "lr0=0.01"]`` -> ``{"epochs": 3, "lr0": 0.01}``, values as Ultralytics reads them."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"'{item}' is not KEY=VALUE: write e.g. lr0=0.01")
        if key in out:
            raise UsageError(f"'{key}' is given twice")
        out[key] = ucfg.smart_value(value.strip())
    return out


def _resolve_data(data: str, task: str) -> tuple[str, list[str]]:
    """The data path to train ``task`` on and notes for the run header; UsageError for data
    Ultralytics would refuse. A classification model takes a class-per-folder directory, every
    other task a dataset YAML (Ultralytics' check_cls_dataset / check_det_dataset)."""
    from rocm_yolo.datasets import ARCHIVES, DataError, check_for_training, datasets_dir

    if data == "demo":
        if task != "detect":
            raise UsageError(f"'demo' is a detection data set: train it with a detection model (e.g. --model yolo26n.yaml), "
                             f"or pass your own {task} data")
        from rocm_yolo.demo import write_demo

        return str(write_demo()), []
    path = Path(data).expanduser()
    bare = not path.parent.parts and not path.suffix  # e.g. 'imagenet10': a name Ultralytics looks up
    if task == CLASSIFY and bare and not path.exists() and datasets_dir() and (datasets_dir() / data).is_dir():
        path = datasets_dir() / data  # check_cls_dataset looks in its datasets_dir
    if task == CLASSIFY and path.is_file():
        if path.suffix.lower() in ARCHIVES:
            return str(path.resolve()), []  # Ultralytics unpacks it into its datasets_dir
        raise UsageError(f"data {data} is a file, but a classification model trains on a directory of class folders "
                         "(DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg): pass that directory")
    if task != CLASSIFY and path.is_dir():
        yamls = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
        example = yamls[0] if yamls else Path(data) / "data.yaml"
        raise UsageError(f"data '{data}' is a directory: a {task} model trains on a dataset YAML, pass it (e.g. {example}); "
                         "a directory of class folders is for a classification model (e.g. --model yolo26n-cls.yaml)")
    if path.exists():
        try:
            notes = check_for_training(path, task)
        except DataError as e:
            raise UsageError(f"data {data}: {e}") from None
        return str(path.resolve()), notes
    if (task == CLASSIFY and bare) or (task != CLASSIFY and path.suffix in {".yaml", ".yml"} and not path.parent.parts):
        return data, []  # a name Ultralytics knows (e.g. coco8.yaml, imagenet10); it downloads it
    if task == CLASSIFY:
        raise UsageError(f"data folder not found: {data} (a classification model takes a directory of class folders)")
    raise UsageError(f"data file not found: {data} (pass a dataset YAML, or 'demo' for the built-in demo set)")


def _check_name(name: str) -> str:
    """``--name`` names a directory inside ``--project``: no absolute path, no ``..``."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or name in (".", ""):
        raise UsageError(f"--name {name!r} must stay inside --project: give a plain name such as 'exp1' "
                         "(use --project to choose where runs go)")
    return name


def _run_dir(project: Path, name: str, exist_ok: bool) -> Path:
    """The run directory for a new run, claimed (created) now and locked by this process.

    Ultralytics' naming: ``train``, ``train-2``, ... With ``exist_ok=True`` an existing
    directory is reused, unless it holds a run to resume or another supervisor holds it.
    """
    path = project / name
    if exist_ok and path.is_dir():
        ownership.acquire(path)  # refuses a live run before anything is touched
        if RunPaths(path).last.exists():
            ownership.release(path)
            raise UsageError(f"{path} already holds weights/last.pt: continue it with --resume {RunPaths(path).last}, "
                             "or choose another --name")
        return path
    path = ownership.claim_run_dir(project, name)
    ownership.acquire(path)
    return path


def _find_resume(resume: str | bool, project: Path) -> Path:
    """The ``weights/last.pt`` a ``--resume`` means; it must sit in a run directory."""
    if resume is True or resume == "":
        last = checkpoints.find_latest(project)
        if last is None:
            raise UsageError(f"no last.pt under {project} to resume: pass the checkpoint, e.g. --resume runs/detect/train/weights/last.pt")
        return last
    last = Path(str(resume)).expanduser().resolve()
    if last.is_dir():
        last = RunPaths(last).last if (last / "weights").is_dir() else last / "last.pt"
    if last.parent.name != "weights":
        raise UsageError(f"--resume {resume}: a resume continues a run, so it takes RUN/weights/last.pt; "
                         f"to start a new run from these weights use --model {resume}")
    return last


def _resume_checkpoint(resume: str | bool, last: Path) -> tuple[Path, str | None]:
    """The checkpoint a resume starts from: a mid-epoch checkpoint named by the user, else the run's newest valid one."""
    if not isinstance(resume, bool) and resume != "" and checkpoints.is_mid_checkpoint(last):
        reason = checkpoints.verify(last)
        if reason is not None:
            raise UsageError(f"checkpoint {last} is unusable ({reason}): resume with --resume {last.with_name('last.pt')}")
        return last, None
    return checkpoints.choose_resume_point(last.with_name("last.pt"))


def _check_device(device: object) -> None:
    """One GPU per run: Ultralytics' multi-GPU (DDP) ranks run without rocm-yolo's callbacks."""
    text = str(device if device is not None else "").strip().strip("[]()")
    ids = [x.strip() for x in text.split(",") if x.strip()]
    if len(ids) > 1:
        raise UsageError(f"--device {device}: multi-GPU training is not supported yet (Ultralytics starts its DDP ranks "
                         "itself, where rocm-yolo cannot watch them or patch their DataLoaders); train on one GPU, "
                         f"e.g. --device {ids[0]}")


def default_model(data: str | None) -> str:
    """Ultralytics' detect default of the installed version; as a YAML for the demo (no download).

    A directory can only be classification data, so it gets Ultralytics' classify default.
    """
    task = CLASSIFY if data and data != "demo" and Path(data).expanduser().is_dir() else "detect"
    name = ucfg.load().task2model.get(task, "yolo26n-cls.pt" if task == CLASSIFY else "yolo26n.pt")
    return str(Path(name).with_suffix(".yaml")) if data == "demo" else name


def make_spec(
    data: str | None = None,
    *,
    model: str | None = None,
    workers: object | None = None,
    profile: str | None = None,
    epochs: int | None = None,
    imgsz: int | None = None,
    batch: object | None = None,
    device: str | None = None,
    project: str | None = None,
    name: str | None = None,
    resume: str | bool | None = None,
    conv: str | None = None,
    checkpoint_every: object | None = None,
    extra: Mapping[str, Any] | None = None,
) -> RunSpec:
    """Validate everything the user gave and return the spec of the first attempt."""
    extra = dict(extra or {})
    interval = checkpoints.parse_interval(checkpoint_every) if checkpoint_every is not None else None
    for key, why in NOT_KEYS.items():
        if key in extra:
            raise UsageError(f"'{key}=' is not accepted here: {why}")
    flags = {"model": model, "workers": workers, "epochs": epochs, "imgsz": imgsz, "batch": batch,
             "device": device, "project": project, "name": name}
    for key in FLAG_KEYS:
        if key in extra:
            if flags[key] is not None:
                raise UsageError(f"'{key}' is given twice (as --{key} and {key}=): keep one")
            flags[key] = extra.pop(key)
    if "data" in extra:
        if data is not None:
            raise UsageError("'data' is given twice (as DATA and data=): keep one")
        data = str(extra.pop("data"))
    if conv is not None and conv not in CONV_STRATEGIES:
        raise UsageError(f"--conv {conv}: choose one of {', '.join(CONV_STRATEGIES)}")
    loader_overrides = {k: extra.pop(k) for k in list(extra) if k in LOADER_KEYS}
    val = extra.pop("val", None)
    for key in list(extra):
        extra[key] = ucfg.check_train_arg(key, extra[key], extra_keys=LOADER_KEYS)
    for key in ("epochs", "imgsz", "batch"):
        if flags[key] is not None:
            flags[key] = ucfg.check_train_arg(key, flags[key])
    user_keys = {k for k, v in flags.items() if v is not None} | set(extra) | set(loader_overrides)
    if val is not None:
        user_keys.add("val")
    if conv is not None:
        user_keys.add("conv")

    previous = None
    resuming = resume is not None and resume is not False
    model_name = str(flags["model"] or ("" if resuming else default_model(data)))
    if flags["model"] and not Path(model_name).suffix:
        raise UsageError(f"--model {model_name}: give a .pt checkpoint or a .yaml model definition (e.g. yolo26n.yaml)")
    task = task_for_model(model_name) if model_name else None
    # Ultralytics' layout runs/TASK/NAME; a bare --resume looks through every task's runs
    project_dir = Path(flags["project"] or (Path("runs") / task if task else Path("runs"))).expanduser().resolve()
    name = _check_name(str(flags["name"] or "train"))
    _check_device(flags["device"] if flags["device"] is not None else extra.get("device"))
    resume_notes: list[str] = []
    data_notes: list[str] = []
    if resuming:
        last = _find_resume(resume, project_dir)
        run_dir = last.parent.parent
        previous = latest_spec(run_dir)
        if profile is None and previous is not None:
            profile = previous.profile
        if workers is None and flags["workers"] is None and previous is not None and profile == previous.profile:
            # the run's own request: safe halves it again from that, never from its own halved count
            flags["workers"] = previous.loader.workers if previous.workers_requested is None else previous.workers_requested
        if previous is not None and profile != previous.profile:
            resume_notes.append(f"resume changes the profile: {previous.profile} -> {profile}")
        elif previous is not None:  # same profile: the user's own settings of that run still hold
            for key in LOADER_KEYS & set(previous.user_keys) - set(loader_overrides):
                loader_overrides[key] = getattr(previous.loader, key)
            if val is None and "val" in previous.user_keys:
                val = previous.val
            user_keys |= (LOADER_KEYS | {"val"}) & set(previous.user_keys)
        if conv is None and previous is not None and "conv" in previous.user_keys:
            conv = previous.conv
            user_keys.add("conv")
        if interval is None and previous is not None:
            interval = checkpoints.parse_interval(previous.checkpoint_every)
        if data:
            # the task from the checkpoint; before the first one, from the model the run was started with
            model_for_task = last if last.exists() or previous is None else previous.model
            data_path, data_notes = _resolve_data(data, task_for_model(model_for_task))
        else:
            data_path = previous.data if previous else ""
        train_args: dict[str, Any] = {"data": data_path} if data else {}  # a moved data set: say where it is now
        if data:
            user_keys.add("data")
    else:
        if not data:
            raise UsageError("DATA is required: a dataset YAML (a directory of class folders for a classification model), "
                             "or 'demo' for the built-in demo set (or --resume LAST_PT)")
        data_path, data_notes = _resolve_data(data, task)
        if data == "demo":
            for key, value in DEMO_DEFAULTS.items():
                if flags.get(key) is None and key not in extra:
                    extra[key] = value
        train_args = {"data": data_path}
    resolved = resolve(profile or DEFAULT_PROFILE, flags["workers"], loader_overrides, val=val)
    for key in ("epochs", "imgsz", "batch", "device"):
        if flags[key] is not None:
            train_args[key] = flags[key]
    train_args.update(extra)

    # Everything the user gave is valid: only now take the run directory (and hold it).
    notes = list(resolved.warnings) + data_notes
    if resuming:
        ownership.acquire(run_dir)  # refuses a live run before anything in it is touched
        try:
            ckpt, note = _resume_checkpoint(resume, last)
        except BaseException:
            ownership.release(run_dir)
            raise
        notes += ([note] if note else []) + resume_notes
        model_name = str(ckpt)
    else:
        ckpt = None
        run_dir = _run_dir(project_dir, name, bool(extra.get("exist_ok", False)))
        train_args.update(project=str(run_dir.parent), name=run_dir.name, exist_ok=True)
    return RunSpec(
        data=data_path,
        model=model_name,
        run_dir=str(run_dir),
        profile=resolved.profile.name,
        loader=resolved.loader,
        val=resolved.val,
        train_args=train_args,
        user_keys=tuple(sorted(user_keys)),
        env=resolved.env,
        resume=str(ckpt) if ckpt else None,
        conv=conv or "auto",
        checkpoint_every=(interval or checkpoints.parse_interval(checkpoints.DEFAULT_INTERVAL)).text,
        attempt=(previous.attempt + 1) if previous else 1,
        workers_requested=resolved.requested_workers,
        notes=tuple(notes),
    )


def run(spec: RunSpec, config: WatchdogConfig, *, user_resume: bool = False) -> RunResult:
    """Run ``spec`` under the supervisor; Ctrl-C and SIGTERM stop the whole tree.

    The run directory stays locked to this process until the supervisor is done. A new run
    that ends in a usage error (the child found the data unusable) leaves no directory.
    """
    ownership.acquire(spec.run_dir)  # held already when the spec came from make_spec
    try:
        supervisor = Supervisor(spec, config, user_resume=user_resume)
        previous = supervisor.install_signal_handlers() if threading.current_thread() is threading.main_thread() else {}
        try:
            for note in spec.notes:
                supervisor.log.info(note)
            result = supervisor.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        ownership.release(spec.run_dir)
    if result.state == State.USAGE_ERROR and spec.attempt == 1 and spec.resume is None:
        _remove_fresh_run(Path(spec.run_dir))
    return result


def _remove_fresh_run(run_dir: Path) -> None:
    """Remove a run directory this invocation created, if it holds no weights."""
    if any(RunPaths(run_dir).weights.glob("*.pt")) or ownership.holder(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)


def train(
    data: str | None = None,
    *,
    workers: int | None = None,
    profile: str | None = None,
    watchdog: bool = True,
    stall_timeout: float | None = None,
    startup_grace: float | None = None,
    max_restarts: int = 3,
    fallback: tuple[str, ...] | str = DEFAULT_LADDER,
    conv: str | None = None,
    resume: str | bool | None = None,
    checkpoint_every: str | int | None = None,
    **kwargs: Any,
) -> RunResult:
    """Train like ``rocm-yolo train``: the same validation, child process and supervisor.

    ``kwargs`` are the other flags (model, epochs, imgsz, batch, device, project, name) and any
    Ultralytics train argument. ``checkpoint_every`` takes what ``--checkpoint-every`` takes
    ("10m", "30s", "1h", "500ba", or 0 for off; default "10m", on resume the run's own). Raises
    :class:`UsageError` for bad input; returns a :class:`RunResult` whose ``exit_code`` matches the CLI's.
    """
    from rocm_yolo.profiles import parse_ladder

    if isinstance(fallback, str):
        ladder = parse_ladder(fallback)
    elif isinstance(fallback, (tuple, list)) and all(isinstance(x, str) for x in fallback):
        ladder = parse_ladder(",".join(fallback))
    else:
        raise UsageError(f"fallback={fallback!r} must be profile names, e.g. 'fast,safe,threads,single'")
    flags = {k: kwargs.pop(k, None) for k in FLAG_KEYS if k not in ("workers",)}
    spec = make_spec(data, workers=workers, profile=profile, resume=resume, conv=conv,
                     checkpoint_every=checkpoint_every, extra=kwargs, **flags)
    config = WatchdogConfig(enabled=watchdog, max_restarts=max_restarts, ladder=ladder,
                            **{k: v for k, v in (("stall_timeout", stall_timeout), ("startup_grace", startup_grace))
                               if v is not None})
    return run(spec, config, user_resume=bool(resume))
