"""DATA and the model: what the model's task trains on, and a model Ultralytics can load, both checked first.

A classification model takes a class-per-folder directory, every other task a dataset YAML
(Ultralytics' ``check_cls_dataset`` / ``check_det_dataset``); data Ultralytics would refuse
is a :class:`~rocm_yolo.errors.UsageError` here, before any process starts. So is a model it cannot load
(:func:`check_model`): a path to no file. What Ultralytics finds or fetches by name is left to it: an asset it
downloads (``yolo26n.pt``), a model YAML of its own (``yolo26n.yaml``, built from its config), a URL.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules.data.check import check_for_training
from rocm_yolo.ultralytics_rules.data.datasets import ARCHIVES, DataError, datasets_dir, setting, settings_file
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
# rtdetr-*, mobile_sam.
ASSET_PREFIXES = ("yolo", "sam", "fastsam", "rtdetr", "mobile")


def check_model(model: str) -> None:
    """Refuse a model Ultralytics cannot load: a checkpoint that is not there (nor in Ultralytics' ``weights_dir``)
    and is none of its assets, or a model YAML that is neither there nor one of Ultralytics' own."""
    path = Path(model).expanduser()
    if "://" in model or path.exists():
        return  # a URL (Ultralytics downloads it), or a file: Ultralytics says what is wrong with its contents
    if path.suffix.lower() in (".yaml", ".yml"):
        if not _ultralytics_yaml(model):
            raise UsageError(
                f"--model {model}: no such model YAML, here or among Ultralytics' own: give its path, or an "
                "Ultralytics model to build (e.g. yolo26n.yaml) or to download (e.g. yolo26n.pt)"
            )
        return
    if path.name.lower().startswith(ASSET_PREFIXES) or any((d / model).exists() for d in _weights_dirs()):
        return
    raise UsageError(
        f"--model {model}: no such file: give the path of a .pt checkpoint, or an Ultralytics model to download "
        "(e.g. yolo26n.pt) or to build from its config (e.g. yolo26n.yaml)"
    )


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
                f"'demo' is a detection data set: train it with a detection model (e.g. --model yolo26n.yaml), "
                f"or pass your own {task} data"
            )
        from rocm_yolo.launch.demo import write_demo

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
            "(DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg): pass that directory"
        )
    if task != CLASSIFY and path.is_dir():
        yamls = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
        example = yamls[0] if yamls else Path(data) / "data.yaml"
        raise UsageError(
            f"data '{data}' is a directory: a {task} model trains on a dataset YAML, pass it (e.g. {example}); "
            "a directory of class folders is for a classification model (e.g. --model yolo26n-cls.yaml)"
        )
    if path.exists():
        try:
            notes = check_for_training(path, task)
        except DataError as e:
            raise UsageError(f"data {data}: {e}") from None
        # as named, not resolved: a symlinked YAML's root is beside the link, where Ultralytics looks
        return str(path.absolute()), notes
    if (task == CLASSIFY and bare) or (task != CLASSIFY and path.suffix in {".yaml", ".yml"} and not path.parent.parts):
        return data, []  # a name Ultralytics knows (e.g. coco8.yaml, imagenet10); it downloads it
    if task == CLASSIFY:
        raise UsageError(f"data folder not found: {data} (a classification model takes a directory of class folders)")
    raise UsageError(f"data file not found: {data} (pass a dataset YAML, or 'demo' for the built-in demo set)")
