"""DATA and the model: what the model's task trains on, and a model Ultralytics can load, both checked first.

A classification model takes a class-per-folder directory, every other task a dataset YAML
(Ultralytics' ``check_cls_dataset`` / ``check_det_dataset``); data Ultralytics would refuse
is a :class:`~rocm_yolo.errors.UsageError` here, before any process starts. So is a model it cannot load
(:func:`check_model`): a path to no file, a file of another kind, a ``.pt`` that is no Ultralytics checkpoint (read
from its structure, not loaded), a data set's YAML given as the model. What Ultralytics finds or fetches by name is
left to it: an asset it downloads (``yolo26n.pt``), a model YAML of its own (``yolo26n.yaml``, built from its
config), a URL.
"""

from __future__ import annotations

import difflib
import glob
import os
import re
from pathlib import Path

from rocm_yolo.errors import UsageError, option
from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules.checkpoint import checkpoint_problem
from rocm_yolo.ultralytics_rules.data.check import check_for_training
from rocm_yolo.ultralytics_rules.data.datasets import (
    ARCHIVES,
    DataError,
    datasets_dir,
    detection_layout,
    read_text,
    setting,
    settings_file,
)
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY


def default_model(data: str | None) -> str:
    """Ultralytics' detect default of the installed version; as a YAML for the demo (no download).

    A directory can only be classification data, so it gets Ultralytics' classify default.
    """
    task = CLASSIFY if data and data != "demo" and Path(data).expanduser().is_dir() else "detect"
    name = ucfg.load().task2model.get(task, "yolo26n-cls.pt" if task == CLASSIFY else "yolo26n.pt")
    return str(Path(name).with_suffix(".yaml")) if data == "demo" else name


# The models of Ultralytics' assets release (ultralytics/assets), which it downloads by file name, even into a
# directory given with it (downloads.attempt_download_asset): yolo*, yoloe-*, yolo_nas_*, sam*, FastSAM-*,
# rtdetr-*, mobile_sam; a name of that kind must be in its list of them (config.asset_names), where it can be read.
ASSET_PREFIXES = ("yolo", "sam", "fastsam", "rtdetr", "mobile")


def check_model(model: str) -> None:
    """Refuse a model Ultralytics cannot train: a file of another kind (``.txt``, an exported ``.onnx``), a ``.pt``
    that is no Ultralytics checkpoint (its structure read, not the file: :func:`model_problem`), a YAML that is no
    model definition (a data set's), a checkpoint that is not there (nor in Ultralytics' ``weights_dir``) and is none
    of its assets, or a model YAML that is neither there nor one of Ultralytics' own."""
    if "://" in model:
        return  # a URL: Ultralytics downloads it
    path = Path(model).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".pt", ".yaml", ".yml"):
        kind = "a directory" if path.is_dir() else f"a {suffix} file" if suffix else "a name without a suffix"
        raise UsageError(
            f"{option('model', model)}: rocm-yolo trains a .pt checkpoint or a .yaml model definition, not {kind} "
            "(Ultralytics trains nothing else: exported models only predict and validate): give e.g. yolo26n.pt or "
            "yolo26n.yaml"
        )
    found = path if path.exists() else next((d / model for d in _weights_dirs() if (d / model).exists()), None)
    if found is not None:
        why = model_problem(found)
        if why is not None:
            raise UsageError(f"{option('model', model)}: {why}")
        return
    if suffix in (".yaml", ".yml"):
        if not _ultralytics_yaml(model):
            raise UsageError(
                f"{option('model', model)}: no such model YAML, here or among Ultralytics' own{near(path)}: give its "
                "path, or an Ultralytics model to build (e.g. yolo26n.yaml) or to download (e.g. yolo26n.pt)"
            )
        return
    if path.name.lower().startswith(ASSET_PREFIXES):
        known = ucfg.asset_names()
        if known is None or _asset_name(path.name) in known:
            return  # Ultralytics downloads it (where its list cannot be read, the name decides)
        close = difflib.get_close_matches(path.name, sorted(known), n=1, cutoff=0.8)
        raise UsageError(
            f"{option('model', model)}: no such file, and no model Ultralytics downloads by that name"
            f"{f' (did you mean {close[0]}?)' if close else ''}: give the path of a .pt checkpoint, or an Ultralytics "
            "model to download (e.g. yolo26n.pt) or to build from its config (e.g. yolo26n.yaml)"
        )
    raise UsageError(
        f"{option('model', model)}: no such file{near(path)}: give the path of a .pt checkpoint, or an Ultralytics "
        "model to download (e.g. yolo26n.pt) or to build from its config (e.g. yolo26n.yaml)"
    )


def model_problem(path: Path) -> str | None:
    """Why the file ``path`` is no model Ultralytics can train, or None. A ``.pt``: its zip structure and the small
    pickle it holds, never its tensors (:func:`rocm_yolo.ultralytics_rules.checkpoint.checkpoint_problem`); a YAML: a
    model definition has a ``backbone`` and a ``head`` (a data set's YAML has neither)."""
    if path.is_dir():
        return "a directory: give a .pt checkpoint or a .yaml model definition"
    if path.suffix.lower() == ".pt":
        return checkpoint_problem(path)
    import yaml

    try:
        cfg = yaml.safe_load(read_text(path))
    except (OSError, DataError, yaml.YAMLError) as e:
        return f"cannot be read as YAML ({getattr(e, 'strerror', None) or e})"
    if isinstance(cfg, dict) and "backbone" in cfg and "head" in cfg:
        return None
    if isinstance(cfg, dict) and ("names" in cfg or "train" in cfg):
        return f"a dataset YAML, not a model definition: pass it as the data ({option('data', path)})"
    return "no model definition (a model YAML has backbone: and head:): give e.g. yolo26n.yaml or yolo26n.pt"


def _asset_name(name: str) -> str:
    """The asset Ultralytics downloads for ``name``: YOLOv3/v5 names become their 'u' models
    (``checks.check_yolov5u_filename``: ``yolov5n.pt`` -> ``yolov5nu.pt``)."""
    if ("yolov3" in name or "yolov5" in name) and name.endswith(".pt") and "u" not in name:
        name = re.sub(r"(.*yolov5([nsmlx]))\.pt", "\\1u.pt", name)
        name = re.sub(r"(.*yolov5([nsmlx])6)\.pt", "\\1u.pt", name)
        name = re.sub(r"(.*yolov3(|-tiny|-spp))\.pt", "\\1u.pt", name)
    return name


def _ultralytics_yaml(model: str) -> bool:
    """Whether Ultralytics finds the model YAML ``model`` in its own tree, as ``nn.tasks.yaml_model_load`` looks:
    the name as given, then without its scale (``yolo26n.yaml`` -> ``yolo26.yaml``), through ``check_file``'s
    search (its package, and beside it)."""
    path = Path(model)
    if re.fullmatch(r"yolov[58][nsmlx]6", path.stem):  # yolov8n6.yaml -> yolov8n-p6.yaml
        path = path.with_name(re.sub(r"(\d+)([nslmx])6(.+)?$", r"\1\2-p6\3", path.stem) + path.suffix)
    names = [str(path), re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", str(path))]
    names = [n.replace("u.yaml", ".yaml") if "yolov3" in n or "yolov5" in n else n for n in names]  # yolov5nu
    root = ucfg.package_dir()
    return any(
        Path(n).exists() or glob.glob(str(root / "**" / n), recursive=True) or glob.glob(str(root.parent / n))
        for n in names
    )


def _weights_dirs() -> list[Path]:
    """Ultralytics' ``weights_dir`` setting (where it looks for a checkpoint named without a directory), read from
    its settings file without importing it; its default, ``weights``, without one."""
    if settings_file() is None or not settings_file().is_file():
        return [Path("weights")]
    found = setting("weights_dir")
    return [Path(found)] if found else []


def resolve_data(data: str, task: str) -> tuple[str, list[str]]:
    """The data path to train ``task`` on and notes for the run header; UsageError for data
    Ultralytics would refuse."""
    if data == "demo":
        if task != "detect":
            raise UsageError(
                "'demo' is a detection data set: train it with a detection model "
                f"(e.g. {option('model', 'yolo26n.yaml')}), or pass your own {task} data"
            )
        from rocm_yolo.request.demo import write_demo

        return str(write_demo()), []
    path = Path(data).expanduser()
    bare = not path.parent.parts and not path.suffix  # e.g. 'imagenet10': a name Ultralytics looks up
    if task == CLASSIFY and bare and not path.exists() and datasets_dir() and (datasets_dir() / data).is_dir():
        path = datasets_dir() / data  # check_cls_dataset looks in its datasets_dir
    if task == CLASSIFY and path.is_file():
        if path.suffix.lower() in ARCHIVES:
            return str(path.absolute()), []  # Ultralytics unpacks it into its datasets_dir
        raise UsageError(
            f"data {data} is a file, but a classification model trains on a directory of class folders "
            f"(DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg): pass that directory, or train {data} with a "
            f"model of its task (e.g. {option('model', 'yolo26n.yaml')})"
        )
    if task == CLASSIFY and path.is_dir() and detection_layout(path):
        raise UsageError(
            f"data {data} is laid out for detection (images/ beside labels/), but a "
            f"classification model trains on class folders ({data}/train/<class>/*.jpg): train it with a detection "
            f"model ({option('model', 'yolo26n.pt')}, or -seg, -pose, -obb) and a dataset YAML that points at it "
            f"(e.g. {Path(data) / 'data.yaml'} with path: {path.absolute()}, train: images/train, val: images/val, "
            "names: {0: ...})"
        )
    if task != CLASSIFY and path.is_dir():
        raise UsageError(_directory_for(data, path, task))
    if path.exists():
        try:
            notes = check_for_training(path, task)
        except DataError as e:
            raise UsageError(f"data {data}: {e}") from None
        # as named, not resolved: a symlinked YAML's root is beside the link, where Ultralytics looks
        return str(path.absolute()), notes
    if task == CLASSIFY and bare:
        return data, []  # a classification set Ultralytics downloads by name (e.g. imagenet10)
    if task != CLASSIFY and shipped_dataset(data):
        return data, []  # a data set Ultralytics ships the YAML of (e.g. coco8.yaml); it downloads the images
    if task == CLASSIFY:
        raise UsageError(
            f"data folder not found: {data}{near(path)} (a classification model takes a directory of class folders)"
        )
    raise UsageError(
        f"data file not found: {data}{near(path)}: give the path of your dataset YAML, a data set Ultralytics ships "
        "by name (e.g. coco8.yaml), or 'demo' for the built-in demo set"
    )


def shipped_dataset(data: str) -> bool:
    """Whether ``data`` is the bare name of a dataset YAML Ultralytics ships (``ultralytics/cfg/datasets/``), which it
    finds by that name and whose images it downloads: ``coco8.yaml``; never a path (``./coco8.yaml``)."""
    if "/" in data or os.sep in data or Path(data).suffix.lower() not in (".yaml", ".yml"):
        return False
    try:
        return (ucfg.package_dir() / "cfg" / "datasets" / data).is_file()
    except UsageError:  # no Ultralytics: nothing it ships
        return False


def _directory_for(data: str, path: Path, task: str) -> str:
    """Why a directory is no data for ``task`` (a dataset YAML is), and what to pass instead."""
    yamls = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
    if yamls:
        return f"data '{data}' is a directory: a {task} model trains on a dataset YAML: pass {yamls[0]}"
    if detection_layout(path):
        return (
            f"data '{data}' is a directory: a {task} model trains on a dataset YAML that points at it: write one (e.g. "
            f"{Path(data) / 'data.yaml'} with path: {path.absolute()}, train: images/train, val: images/val, "
            "names: {0: ...}) and pass it"
        )
    return (
        f"data '{data}' is a directory: a {task} model trains on a dataset YAML (e.g. {Path(data) / 'data.yaml'}); "
        f"a directory of class folders is for a classification model (e.g. {option('model', 'yolo26n-cls.yaml')})"
    )


def near(path: Path) -> str:
    """`` (did you mean data.yaml?)``: a file beside where ``path`` points, of the same kind, with a close name."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        names = [p.name for p in folder.iterdir() if p.suffix.lower() == path.suffix.lower() and p.name != path.name]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    return f" (did you mean {folder / close[0] if path.parent.parts else close[0]}?)" if close else ""
