"""Which Ultralytics task a model trains, decided as Ultralytics decides it, without torch.

The task picks the run directory (``runs/TASK/NAME``, Ultralytics' layout) and the kind of
data the CLI accepts (a class-per-folder directory for ``classify``, a dataset YAML for the
others). Ultralytics reads it from the model itself:

- a ``.pt`` checkpoint: the task stored in it (``train_args``, else the model's ``args`` or
  its ``yaml`` head). :func:`checkpoint_task` reads that from the checkpoint's pickle with
  an unpickler that imports nothing: every class becomes an inert stub, every tensor None;
- a model YAML: the output module of its ``head`` (``Classify``, ``Segment``, ``Pose``...);
- otherwise its name (``ultralytics.nn.tasks.guess_model_task``: ``-cls``/``-seg``/...
  in the file name, or a ``classify``/``segment``/... directory in its path).

Official names (``yolo26n-cls.yaml``, ``yolo26n-seg.pt``) resolve by name when the file is
not on disk (Ultralytics finds or downloads it itself); anything unreadable falls back to
the name rule and then to ``detect``, Ultralytics' own default.
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.run.weights import read_inert, state_of

DETECT, SEGMENT, POSE, OBB, CLASSIFY = "detect", "segment", "pose", "obb", "classify"
# Ultralytics' name rule, in its order (guess_model_task): stem marker or directory name -> task
_NAME_RULES = (
    ("-sem", "semantic", "semantic"),
    ("-seg", "segment", SEGMENT),
    ("-cls", "classify", CLASSIFY),
    ("-pose", "pose", POSE),
    ("-obb", "obb", OBB),
    ("-depth", "depth", "depth"),
)
TASKS = (DETECT, SEGMENT, "semantic", "depth", CLASSIFY, POSE, OBB)


def task_of_name(model: str | Path) -> str:
    """The task Ultralytics guesses from a model's file name and path alone."""
    path = Path(model)
    for marker, directory, task in _NAME_RULES:
        if marker in path.stem or directory in path.parts:
            return task
    return DETECT


def head_task(cfg: dict) -> str | None:
    """The task of a model YAML's output module (Ultralytics' ``cfg2task``)."""
    try:
        m = str(cfg["head"][-1][-2]).lower()
    except (KeyError, IndexError, TypeError):
        return None
    if m in {"classify", "classifier", "cls", "fc"}:
        return CLASSIFY
    for word, task in (
        ("detect", DETECT),
        ("semanticsegment", "semantic"),
        ("segment", SEGMENT),
        ("pose", POSE),
        ("obb", OBB),
        ("depth", "depth"),
    ):
        if word in m:
            return task
    return None


def checkpoint_task(path: str | Path) -> str | None:
    """The task stored in a ``.pt`` checkpoint (its ``train_args``, else its model's ``args`` or ``yaml`` head),
    or None when it cannot be read."""
    ckpt = read_inert(path)
    if not isinstance(ckpt, dict):
        return None
    args = ckpt.get("train_args") if isinstance(ckpt.get("train_args"), dict) else {}
    if args.get("task") in TASKS:
        return args["task"]
    for key in ("model", "ema"):
        state = state_of(ckpt.get(key))
        model_args = state.get("args")
        if isinstance(model_args, dict) and model_args.get("task") in TASKS:
            return model_args["task"]
        found = head_task(state.get("yaml")) if isinstance(state.get("yaml"), dict) else None
        if found:
            return found
    return None


def yaml_task(path: str | Path) -> str | None:
    """The task of a model YAML on disk, from its head; None if it is not one."""
    import yaml

    try:
        cfg = yaml.safe_load(Path(path).read_text(errors="replace"))
    except (OSError, yaml.YAMLError):
        return None
    return head_task(cfg) if isinstance(cfg, dict) else None


def task_for_model(model: str | Path) -> str:
    """The task ``model`` (a .pt checkpoint, a model YAML, or an official name) trains."""
    path = Path(str(model)).expanduser()
    found = None
    if path.is_file():
        found = (
            checkpoint_task(path)
            if path.suffix == ".pt"
            else yaml_task(path)
            if path.suffix in (".yaml", ".yml")
            else None
        )
    return found or task_of_name(path)
