"""DATA and the default model: what the model's task trains on, checked before anything starts.

A classification model takes a class-per-folder directory, every other task a dataset YAML
(Ultralytics' ``check_cls_dataset`` / ``check_det_dataset``); data Ultralytics would refuse
is a :class:`~rocm_yolo.errors.UsageError` here, before any process starts.
"""

from __future__ import annotations

from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules.data.check import check_for_training
from rocm_yolo.ultralytics_rules.data.datasets import ARCHIVES, DataError, datasets_dir
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY


def default_model(data: str | None) -> str:
    """Ultralytics' detect default of the installed version; as a YAML for the demo (no download).

    A directory can only be classification data, so it gets Ultralytics' classify default.
    """
    task = CLASSIFY if data and data != "demo" and Path(data).expanduser().is_dir() else "detect"
    name = ucfg.load().task2model.get(task, "yolo26n-cls.pt" if task == CLASSIFY else "yolo26n.pt")
    return str(Path(name).with_suffix(".yaml")) if data == "demo" else name


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
