"""Ultralytics' rules read without importing it: train arguments, tasks, label lines, its settings file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules import tasks
from rocm_yolo.ultralytics_rules.data import datasets, labels


def test_ultralytics_config_is_read_without_importing_it():
    cfg = ucfg.load()
    assert "epochs" in cfg.int_keys and "lr0" in cfg.fraction_keys and "val" in cfg.bool_keys
    assert cfg.task2model["detect"].endswith(".pt") and cfg.defaults["workers"] >= 0


def test_task_of_a_model_as_ultralytics_decides(tmp_path):
    assert [
        tasks.task_for_model(m)
        for m in (
            "yolo26n-cls.yaml",
            "yolo26n-seg.pt",
            "yolo26n-pose.yaml",
            "yolo26s-obb.pt",
            "yolo26n.pt",
            "yolo11n.yaml",
        )
    ] == ["classify", "segment", "pose", "obb", "detect", "detect"]
    assert tasks.task_for_model("runs/pose/train/weights/best.pt") == "pose"  # not on disk: its path says pose
    custom = tmp_path / "mine.yaml"
    custom.write_text("nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\nhead:\n  - [-1, 1, Classify, [nc]]\n")
    assert tasks.task_for_model(custom) == "classify"
    broken = tmp_path / "broken-seg.pt"
    broken.write_bytes(b"PK\x03\x04 not a zip")
    assert tasks.task_for_model(broken) == "segment"  # unreadable: the name decides


@pytest.mark.parametrize(
    "task, kpt, line, words",
    [
        ("detect", None, "0 0.5 0.5 0.2 0.2", None),
        ("detect", None, "0 0.1 0.1 0.5 0.1 0.5 0.5", None),  # a polygon: Ultralytics takes its box
        ("detect", None, "0 0.5 0.5 0.2", "4 numbers, expected 5"),
        ("detect", None, "2 0.5 0.5 0.2 0.2", "class id 2 out of range"),
        ("detect", None, "0.5 0.5 0.5 0.2 0.2", "not a whole number"),
        ("detect", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2 0.6 0.6 2", None),  # pose labels: the box is kept
        ("segment", None, "0 0.1 0.1 0.5 0.1 0.5 0.5 0.1", "8 numbers, expected a polygon"),
        ("segment", None, "0 0.1 0.1 0.5 0.1 0.5 -0.5", "negative values"),
        ("pose", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2 0.6 0.6 2", None),
        ("pose", [3, 2], "0 0.5 0.5 0.2 0.2 0.5 0.4 0.4 0.6 1.5 0.6", "outside 0..1 (up to 1.5)"),
        ("pose", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2", "11 numbers, expected 14"),
        ("obb", None, "0 0.1 0.1 0.9 0.1 0.9 0.9 0.1 0.9", None),
        ("obb", None, "0 0.5 0.5 0.2 0.2", "a box (class x y w h) where obb needs 9"),
        ("obb", None, "0 0.1 0.1 0.9 0.1 0.9 0.9 nan 0.9", "not finite"),
    ],
)
def test_label_lines_per_task(tmp_path, task, kpt, line, words):
    path = tmp_path / "a.txt"
    path.write_text("\ufeff\n" + line + "\n", encoding="utf-8")  # a BOM and a blank line: Ultralytics ignores both
    problem = labels.check_label(str(path), 2, labels.label_format(task, kpt))
    if words is None:
        assert problem is None
    else:
        assert problem is not None and f"{path}:2: " in problem[1] and words in problem[1], problem


def test_mixed_box_and_polygon_lines_are_named(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n0 0.5 0.5 0.2 0.2\n")
    assert labels.check_label(str(path), 1, labels.label_format("detect")) == (
        "badlabel",
        f"{path}:2: mixes box and polygon lines (Ultralytics skips the image)",
    )
    with pytest.raises(datasets.DataError, match="kpt_shape"):
        labels.label_format("pose", [17, 4])


@pytest.mark.parametrize("where", ["YOLO_CONFIG_DIR", "XDG_CONFIG_HOME"])
def test_datasets_dir_is_read_from_the_settings_file_ultralytics_uses(tmp_path, where):
    """Relative data set roots resolve against Ultralytics' datasets_dir: read from its own settings file."""
    env = {k: v for k, v in os.environ.items() if k not in ("YOLO_CONFIG_DIR", "XDG_CONFIG_HOME")}
    env[where] = str(tmp_path / "config")
    (tmp_path / "config").mkdir()  # as a user's config directory is (else older Ultralytics fall back to /tmp)
    code = (
        "from ultralytics.utils import SETTINGS, SETTINGS_FILE; print(SETTINGS_FILE); print(SETTINGS['datasets_dir'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    file, default = out.stdout.strip().splitlines()[-2:]
    assert datasets.settings_file(env) == Path(file) and Path(file).is_relative_to(tmp_path)
    assert datasets.datasets_dir(env) == Path(default)  # the default Ultralytics wrote on its first import
    settings = json.loads(Path(file).read_text())
    Path(file).write_text(json.dumps({**settings, "datasets_dir": str(tmp_path / "mine")}))
    assert datasets.datasets_dir(env) == tmp_path / "mine"


def test_the_shared_tmp_settings_fallback_is_read_only_where_ultralytics_uses_it_and_only_the_users_own(
    tmp_path, monkeypatch
):
    """Another user made /tmp/Ultralytics/settings.json first (older Ultralytics' fallback, world-writable /tmp) and
    chose the datasets_dir: it is never read while the user's own config folder can be made, nor ever as theirs."""
    shared = tmp_path / "tmp-Ultralytics"
    shared.mkdir()
    (shared / "settings.json").write_text(json.dumps({"datasets_dir": str(tmp_path / "strangers")}))
    monkeypatch.setattr(datasets, "SHARED_FALLBACK", shared)
    monkeypatch.setattr(datasets.tempfile, "tempdir", str(tmp_path / "no-tmpdir"))
    usable = {"YOLO_CONFIG_DIR": str(tmp_path / "config")}  # missing but makeable: Ultralytics uses it
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unusable = {"YOLO_CONFIG_DIR": str(blocked / "config")}  # under a file: Ultralytics falls back
    assert datasets.settings_file(usable) == tmp_path / "config" / "Ultralytics" / "settings.json"
    assert datasets.datasets_dir(usable) is None  # no settings of the user's yet: never the stranger's
    assert datasets.datasets_dir(unusable) == tmp_path / "strangers"  # the user's own fallback: read as Ultralytics
    os.chown(shared / "settings.json", 65534, 65534)  # now another user's file
    assert datasets.settings_file(unusable) is None and datasets.datasets_dir(unusable) is None
    os.chown(shared / "settings.json", os.geteuid(), os.getegid())
    os.chown(shared, 65534, 65534)  # the user's file in another user's folder: they could swap it
    assert datasets.datasets_dir(unusable) is None
