"""From a :class:`~rocm_yolo.request.train_request.TrainRequest` to the first attempt's
:class:`~rocm_yolo.run.spec.RunSpec`: validated, with no side effects.

The CLI and the Python API both come through :func:`make_spec`, so they validate the same
way. It reads (the data set, a resumed run's previous spec, Ultralytics' rules) but writes
and claims nothing: taking the run directory is :mod:`.claim`'s step, once everything the
user gave is known to be valid. Nothing here imports torch or Ultralytics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rocm_yolo.conv.strategies import CHOICES as CONV_STRATEGIES
from rocm_yolo.errors import UsageError, command, option
from rocm_yolo.gpu import count as gpu_count
from rocm_yolo.policy import placement
from rocm_yolo.policy.profiles import LOADER_KEYS, PROFILES, resolve
from rocm_yolo.request import cluster, ram_cache
from rocm_yolo.request.data_path import check_model, default_model, resolve_data
from rocm_yolo.request.demo import DEMO_DEFAULTS
from rocm_yolo.request.resume_target import find_resume, run_args
from rocm_yolo.request.train_request import ULTRALYTICS_FLAGS, TrainRequest
from rocm_yolo.run import devices, weights
from rocm_yolo.run.midepoch_state import CheckpointInterval, parse_interval
from rocm_yolo.run.nodes import Nodes
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec, carry_over, latest_spec, next_attempt
from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules.resume import RESUME_ALLOWED
from rocm_yolo.ultralytics_rules.tasks import task_for_model

NOT_KEYS = {"mode": "rocm-yolo always trains", "task": "the task follows the model", "resume": "use --resume [LAST_PT]"}


def check_name(name: str) -> str:
    """``--name`` names a directory inside ``--project``: no absolute path, no ``..``."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or name in (".", ""):
        raise UsageError(
            f"{option('name', repr(name))} must stay inside {option('project')}: give a plain name such as 'exp1' "
            f"(use {option('project')} to choose where runs go)"
        )
    return name


def check_devices(
    device: object, batch: object, batch_source: str = "given", nodes: Nodes | None = None, *, the_runs: bool = False
) -> None:
    """A device Ultralytics trains on, GPUs the machine has, each named once, and on several (one DDP rank each, on
    each of ``nodes``) a batch that divides by their number: the batch given, Ultralytics' default, or on a resume the
    run's own (``batch_source``; a resume keeps its run's global batch, None: unknown). ``the_runs``: the device is
    the resumed run's own, not one the user gave."""
    why = placement.check_list(device) or placement.check_kind(device)
    if why is not None:
        raise UsageError(why)
    ids = devices.gpu_ids(device)
    if nodes is not None and not ids:
        shown = option("device", device) if device not in (None, "") else f"no {option('device')}"
        raise UsageError(
            f"{shown}: on more than one machine give the GPU ids of this node, e.g. {option('device', '0,1')} (one "
            "rank each; each node names its own)"
        )
    if len(set(ids)) != len(ids):
        raise UsageError(
            f"{option('device', device)}: a GPU is named twice; name each once, e.g. {option('device', ids[0])}"
        )
    if batch is None and batch_source == "default":
        batch = ucfg.default("batch")
    count = nodes.count if nodes is not None else 1
    why = placement.check_batch(batch, ids, batch_source, count) if batch is not None else None
    if why is not None:
        raise UsageError(why)
    _check_gpus_exist(device, ids, the_runs)


def _check_gpus_exist(device: object, ids: list[str], the_runs: bool = False) -> None:
    """Every GPU id names a GPU this machine shows a run, one id as several: the KFD topology, else none where no GPU
    runtime has a device file here, else a bounded probe of torch; nothing is refused when none of them can tell."""
    if not ids:
        return
    visible = gpu_count.visible_gpus()
    if visible is None or max(int(i) for i in ids) < visible:
        return
    if the_runs:  # a resume on the run's own GPUs, which this machine does not have
        raise UsageError(
            f"the run trained on device {device}, and this machine shows {visible or 'no'} GPU(s) to a run: resume "
            f"on the GPUs it has with {option('device', 'cpu' if not visible else '0')}"
        )
    if visible == 0:
        why = (
            "torch sees none"
            if gpu_count.device_files()
            else f"no GPU runtime's device file: {gpu_count.DEVICE_FILES[0]}"
        )
        raise UsageError(
            f"{option('device', device)}: this machine shows no GPU to a run ({why}): train with "
            f"{option('device', 'cpu')}, or see why with rocm-yolo doctor"
        )
    have = ",".join(str(i) for i in range(visible))
    raise UsageError(
        f"{option('device', device)} names GPU {max(int(i) for i in ids)}, but this machine shows {visible} "
        f"(ids {have}): name GPUs it has, e.g. {option('device', have if visible > 1 else '0')}"
    )


def _with_cfg_file(extra: dict, flags: dict, data: str | None) -> dict:
    """``cfg=FILE`` read here, its keys checked as KEY=VALUE ones are (what is given explicitly wins, as in
    Ultralytics): a resume or a run directory named in it goes through the same checks and claim as one
    given on the command line. Keys at Ultralytics' defaults change nothing and are left out."""
    import yaml

    from rocm_yolo.ultralytics_rules.data.datasets import DataError, read_text

    extra = dict(extra)
    given = extra.pop("cfg")
    if given is None:
        return extra
    try:
        loaded = yaml.safe_load(read_text(Path(str(given)).expanduser()))
    except (OSError, DataError, yaml.YAMLError) as e:
        raise UsageError(f"cfg={given}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"cfg={given}: not a mapping of Ultralytics arguments (key: value lines)")
    defaults = ucfg.load().defaults
    for key, value in loaded.items():
        if key == "cfg" or (key in defaults and defaults[key] == value):
            continue
        if key in NOT_KEYS:
            raise UsageError(f"cfg={given}: '{key}: {value}' is not accepted here: {NOT_KEYS[key]}")
        if (key in flags and flags[key] is not None) or (key == "data" and data is not None):
            continue
        extra.setdefault(key, value)
    return extra


def _check_paths(request: TrainRequest) -> None:
    """``project``, ``name``, ``data`` and ``model`` name files: text (from Python a number or a list is no path)."""
    for key in ("data", "project", "name", "model"):
        value = getattr(request, key)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise UsageError(f"{option(key, value)}: give a path (text), e.g. {option(key, EXAMPLES[key])}")
    if not isinstance(request.watchdog, bool):
        raise UsageError(f"{option('watchdog', request.watchdog)}: give True or False")


EXAMPLES = {"data": "data.yaml", "project": "runs/detect", "name": "exp1", "model": "yolo26n.pt"}


def _check_profile_key(value: object) -> None:
    """``profile=`` is Ultralytics' own switch (True or False); a name there means rocm-yolo's ``--profile``."""
    if isinstance(value, bool):
        return
    given = str(value)
    raise UsageError(
        f"profile={given}: rocm-yolo's settings profile is {option('profile', given if given in PROFILES else 'NAME')} "
        f"({', '.join(PROFILES)}); profile= is Ultralytics' own switch, True or False (it times ONNX and TensorRT "
        "during training)"
    )


@dataclass
class CheckedRequest:
    """A request checked and sorted out: the flags, Ultralytics arguments, loader settings, and which keys the user
    set."""

    data: str | None
    flags: dict  # ULTRALYTICS_FLAGS -> value or None
    extra: dict  # every other Ultralytics train argument, type-checked
    loader: dict  # loader KEY=VALUE overrides (policy.profiles.LOADER_SETTINGS)
    val: object | None
    conv: str | None
    interval: CheckpointInterval | None
    profile: str | None
    user_keys: set = field(default_factory=set)
    notes: list = field(default_factory=list)  # lines for the run header

    @classmethod
    def of(cls, request: TrainRequest) -> "CheckedRequest":
        data, conv = request.data, request.conv
        extra = dict(request.overrides or {})
        flags = {key: getattr(request, key) for key in ULTRALYTICS_FLAGS}
        if "cfg" in extra:
            extra = _with_cfg_file(extra, flags, data)
        interval = parse_interval(request.checkpoint_every) if request.checkpoint_every is not None else None
        for key, why in NOT_KEYS.items():
            if key in extra:
                raise UsageError(f"'{key}=' is not accepted here: {why}")
        _check_profile_key(extra.get("profile", False))
        for key in ULTRALYTICS_FLAGS:
            if key in extra:
                if flags[key] is not None:
                    raise UsageError(f"'{key}' is given twice (as --{key} and {key}=): keep one")
                flags[key] = extra.pop(key)
        if "data" in extra:
            if data is not None:
                raise UsageError("'data' is given twice (as DATA and data=): keep one")
            data = str(extra.pop("data"))
        if conv is not None and conv not in CONV_STRATEGIES:
            raise UsageError(f"{option('conv', conv)}: choose one of {', '.join(CONV_STRATEGIES)}")
        loader = {k: extra.pop(k) for k in list(extra) if k in LOADER_KEYS}
        val = extra.pop("val", None)
        for key in list(extra):
            extra[key] = ucfg.check_train_arg(key, extra[key], extra_keys=LOADER_KEYS)
        for key in ("epochs", "imgsz", "batch"):
            if flags[key] is not None:
                flags[key] = ucfg.check_train_arg(key, flags[key])
        user_keys = {k for k, v in flags.items() if v is not None} | set(extra) | set(loader)
        user_keys |= ({"val"} if val is not None else set()) | ({"conv"} if conv is not None else set())
        return cls(data, flags, extra, loader, val, conv, interval, request.profile, user_keys)

    def model_name(self, resuming: bool) -> str:
        name = str(self.flags["model"] or ("" if resuming else default_model(self.data)))
        if self.flags["model"] and not resuming:  # a resume refuses --model: it continues the run's own
            check_model(name)
        return name

    def carry(self, run_dir: Path, node: int | None = None) -> RunSpec | None:
        """Take over what the user set for the run in ``run_dir`` and does not give again (:func:`carry_over`);
        the run's newest spec (this node's, on more than one machine)."""
        previous = _previous_spec(run_dir, node)
        if previous is None:
            written = RunPaths(run_dir, node).specs()
            if written:  # e.g. by another rocm-yolo version: say so rather than drop the run's settings silently
                self.notes.append(
                    f"the run's settings in {written[-1].name} cannot be read (written by another rocm-yolo "
                    "version?): the resume takes the defaults and what you give now"
                )
            return None
        if self.profile is None:
            self.profile = previous.profile
        elif self.profile != previous.profile:
            self.notes.append(f"resume changes the profile: {previous.profile} -> {self.profile}")
        carried = carry_over(previous, self.profile, resolve)
        if self.flags["workers"] is None:
            self.flags["workers"] = carried.workers
        self.loader = {**carried.loader, **self.loader}
        self.val = carried.val if self.val is None else self.val
        self.conv = carried.conv if self.conv is None else self.conv
        self.interval = self.interval or parse_interval(carried.checkpoint_every)
        self.user_keys |= set(carried.user_keys) & (LOADER_KEYS | {"val", "conv"})
        self.notes += [carried.note(self.profile)] if carried.dropped else []
        return previous


def _previous_spec(run_dir: Path, node: int | None) -> RunSpec | None:
    """A resumed run's newest spec: this node's, else the run's on one machine, else its nodes' (the first found)."""
    for candidate in ([node] if node is not None else []) + [None] + RunPaths(run_dir, None).nodes():
        found = latest_spec(run_dir, candidate)
        if found is not None:
            return found
    return None


def make_spec(request: TrainRequest) -> RunSpec:
    """Validate everything the user gave and return the spec of the first attempt, unclaimed.

    For a new run ``run_dir`` is the directory asked for (``project/name``, Ultralytics'
    ``runs/TASK/NAME`` by default), which :func:`rocm_yolo.request.claim.claim` takes or numbers
    on; for a resume it is the run's own directory and ``resume`` the checkpoint named (or the
    run's ``last.pt``), from which ``claim`` chooses the newest valid one.
    """
    nodes = cluster.resolve(request.nnodes, request.node_rank, request.rdzv_endpoint, request.rdzv_timeout)
    _check_paths(request)
    req = CheckedRequest.of(request)
    model_name = req.model_name(request.resuming)
    task = task_for_model(model_name) if model_name else None
    # Ultralytics' layout runs/TASK/NAME; a bare --resume looks through every task's runs
    project_dir = Path(req.flags["project"] or (Path("runs") / task if task else Path("runs"))).expanduser().resolve()
    run_name = check_name(str(req.flags["name"] or "train"))
    if request.resuming:
        return _resumed_run(req, request.resume, project_dir, nodes)
    return _new_run(req, model_name, task, project_dir / run_name, nodes)


def _finish(
    req: CheckedRequest,
    *,
    data_path: str,
    model: str,
    run_dir: Path,
    train_args: dict,
    task: str | None = None,
    resume: str | None = None,
    attempt: int = 1,
    saved: dict | None = None,
    nodes: Nodes | None = None,
    layout: devices.Layout | None = None,
) -> RunSpec:
    """The spec: the profile resolved with the request's workers and loader settings, the flags as train args
    (``saved``: a resumed run's own train arguments, which the resume keeps unless the request gives others)."""
    resolved = resolve(req.profile or TrainRequest.default_of("profile"), req.flags["workers"], req.loader, val=req.val)
    for key in ("epochs", "imgsz", "batch", "device"):
        if req.flags[key] is not None:
            train_args[key] = req.flags[key]
    train_args.update(req.extra)
    if req.flags["batch"] is not None or "batch" in req.extra:
        batch, source = train_args.get("batch"), "given"
    else:
        batch, source = (saved or {}).get("batch"), ("run" if resume is not None else "default")
    the_runs = resume is not None and req.flags["device"] is None and "device" not in req.extra
    if source == "run" and layout is not None:  # the run keeps its images a step on the GPUs it has now
        now = devices.world_size(train_args, nodes)
        relaid = placement.relayout(layout, now, _gpus_named(train_args.get("device"), nodes))
        check_devices(train_args.get("device"), None, source, nodes, the_runs=the_runs)
        if relaid.changed:
            req.notes.append(relaid.describe())
    else:
        check_devices(train_args.get("device"), batch, source, nodes, the_runs=the_runs)
        given = batch if batch is not None or resume is not None else ucfg.default("batch")
        new = devices.Layout.of(given, devices.world_size(train_args, nodes))
        if layout is not None and new is not None and new != layout:
            req.notes.append(
                f"a new global batch: {layout.batch} -> {new.batch} images a step; the epoch in progress goes on "
                "with the images it has left"
            )
        layout = new
    if nodes is not None and nodes.elastic and layout is not None:  # every round the run may go on with
        per_node = max(len(devices.gpu_ids(train_args.get("device"))), 1)
        placement.check_rounds(layout, per_node, nodes.counts, option("nnodes", nodes.nnodes))
    effective = {**(saved or {}), **train_args}  # what Ultralytics trains with (a resume: the run's, changed)
    if ram_cache.wants_ram(effective) and task is not None:
        imgsz = int(effective.get("imgsz") or ucfg.default("imgsz"))
        profile, line = ram_cache.plan(data_path, task, imgsz, resolved.loader, req.profile is not None)
        if profile is not None:
            resolved = resolve(profile, req.flags["workers"], {}, val=req.val)
        req.notes += [line] if line else []
    return RunSpec(
        data=data_path,
        model=model,
        run_dir=str(run_dir),
        profile=resolved.profile.name,
        loader=resolved.loader,
        val=resolved.val,
        train_args=train_args,
        user_keys=tuple(sorted(req.user_keys)),
        env=resolved.env,
        resume=resume,
        conv=req.conv or TrainRequest.default_of("conv"),
        checkpoint_every=(req.interval or parse_interval(TrainRequest.default_of("checkpoint_every"))).text,
        attempt=attempt,
        workers_requested=resolved.requested_workers,
        notes=tuple(list(resolved.warnings) + req.notes),
        nodes=nodes,
        layout=layout.to_dict() if layout is not None else None,
    )


def _gpus_named(device: object, nodes: Nodes | None) -> str:
    """How the user named this attempt's GPUs, for a message."""
    shown = f"--device {device}" if device not in (None, "") else "no --device"
    return shown + (f" on each of {nodes.count} nodes" if nodes is not None and nodes.count > 1 else "")


def run_layout(previous: RunSpec | None, saved: dict) -> devices.Layout | None:
    """A resumed run's :class:`~rocm_yolo.run.devices.Layout`: its newest spec's, else the one its checkpoint's
    ``batch`` made on the GPUs it trained on (the spec's, else the checkpoint's ``device``)."""
    if previous is not None and previous.run_layout is not None:
        return previous.run_layout
    args = previous.train_args if previous is not None and previous.train_args.get("device") else saved
    gpus = devices.world_size(args, previous.nodes if previous is not None else None)
    return devices.Layout.of(saved.get("batch"), gpus)


def _new_run(req: CheckedRequest, model: str, task: str, run_dir: Path, nodes: Nodes | None = None) -> RunSpec:
    if not req.data:
        raise UsageError(
            f"{option('data')} is required: a dataset YAML (a directory of class folders for a classification model), "
            f"or 'demo' for the built-in demo set (or {option('resume', 'LAST_PT')})"
        )
    data_path, data_notes = resolve_data(req.data, task)
    req.notes += data_notes
    if req.data == "demo":
        for key, value in DEMO_DEFAULTS.items():
            if req.flags.get(key) is None and key not in req.extra:
                req.extra[key] = value
    return _finish(
        req, data_path=data_path, model=model, run_dir=run_dir, train_args={"data": data_path}, task=task, nodes=nodes
    )


# What a resume honours besides Ultralytics' own whitelist: rocm-yolo sets these on the trainer itself
# (trainer.callbacks.trainer_settings), or they only say where the run is.
RESUME_HONOURS = RESUME_ALLOWED | {"epochs", "workers", "val", "data", "project", "name", "exist_ok"}


def _refuse_what_a_resume_drops(req: CheckedRequest, last: Path) -> None:
    """A key a resume cannot honour is refused, never silently dropped (Ultralytics' resume keeps the run's)."""
    if req.flags["model"] is not None:
        raise UsageError(
            f"{option('model', req.flags['model'])}: a resume continues the run's own model; drop {option('model')}, "
            f"or start a new run from other weights without {option('resume')}"
        )
    given = sorted((set(req.extra) | {k for k, v in req.flags.items() if v is not None}) - RESUME_HONOURS)
    if given:
        key = given[0]
        value = req.extra.get(key, req.flags.get(key))
        raise UsageError(
            f"{key}={value}: a resume keeps the run's {key} (Ultralytics' resume takes it from the checkpoint); "
            f"to train with another, start a new run from its weights: {command(model=last, keys={key: value})}"
        )


def _resumed_run(req: CheckedRequest, resume: str | bool, project_dir: Path, nodes: Nodes | None = None) -> RunSpec:
    last = find_resume(resume, project_dir)
    _refuse_what_a_resume_drops(req, last)
    run_dir = last.parent.parent
    if nodes is not None and weights.is_mid_checkpoint(last):
        raise UsageError(
            f"{option('resume', resume)}: on more than one machine every node resumes from the run's newest "
            f"checkpoint, the one they all see: resume with {option('resume', run_dir)}"
        )
    previous = req.carry(run_dir, nodes.node if nodes is not None else None)
    if req.data:
        # the task from the checkpoint; before the first one, from the model the run was started with
        model_for_task = last if last.exists() or previous is None else previous.model
        data_path, data_notes = resolve_data(req.data, task_for_model(model_for_task))
        req.notes = data_notes + req.notes
        req.user_keys.add("data")
        train_args = {"data": data_path}  # a moved data set: say where it is now
    else:
        data_path, train_args = (previous.data if previous else ""), {}
    saved = run_args(last)  # what the run trained with, as its newest checkpoint says (Ultralytics' resume reads it)
    if req.flags["device"] is None and "device" not in req.extra:
        # the one Ultralytics resumes on: the header and the presets follow it
        device = (previous.train_args.get("device") if previous else None) or saved.get("device")
        if device is not None and str(device).strip():
            train_args["device"] = str(device)
    return _finish(
        req,
        data_path=data_path,
        model=str(last),
        run_dir=run_dir,
        train_args=train_args,
        task=task_for_model(last if last.exists() or previous is None else previous.model),
        resume=str(last),
        attempt=next_attempt(run_dir, nodes.node if nodes is not None else None),
        saved=saved,
        nodes=nodes,
        layout=run_layout(previous, saved),
    )
