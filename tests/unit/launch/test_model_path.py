"""A model Ultralytics cannot load is bad input: one line before anything starts; what Ultralytics finds or
downloads by name is left to it."""

from __future__ import annotations

import json

import pytest

from helpers import prepare
from rocm_yolo.errors import UsageError
from rocm_yolo.launch.data_path import check_model


@pytest.mark.parametrize(
    "model",
    [
        "yolo26n.pt",  # an asset Ultralytics downloads
        "yolo26n-seg.pt",
        "weights/yolo11n.pt",  # downloaded into the directory given
        "yolo26n.yaml",  # built from Ultralytics' config (yolo26.yaml at scale n)
        "yolo26s-cls.yaml",
        "yolov8n6.yaml",  # renamed yolov8n-p6.yaml by Ultralytics
        "https://example.com/models/best.pt",  # downloaded
    ],
)
def test_what_ultralytics_finds_or_downloads_is_left_to_it(model):
    check_model(model)


@pytest.mark.parametrize(
    "model, why",
    [
        ("/nope.pt", "--model /nope.pt: no such file"),
        ("runs/detect/train/weights/last.pt", "no such file: give the path of a .pt checkpoint"),
        ("best.pt", "no such file"),
        ("/nope.yaml", "no such model YAML, here or among Ultralytics' own"),
        ("my-net.yaml", "no such model YAML"),
    ],
)
def test_a_model_that_is_not_there_is_refused_in_one_line(model, why):
    with pytest.raises(UsageError) as caught:
        check_model(model)
    assert why in str(caught.value) and "\n" not in str(caught.value) and "yolo26n.pt" in str(caught.value)


def test_a_file_that_is_there_and_ultralytics_weights_dir_are_taken(tmp_path, monkeypatch):
    mine = tmp_path / "mine.pt"
    mine.write_bytes(b"x")
    check_model(str(mine))  # its contents are Ultralytics' to judge
    weights = tmp_path / "w"
    weights.mkdir()
    (weights / "custom.pt").write_bytes(b"x")
    config = tmp_path / "cfg"
    (config / "Ultralytics").mkdir(parents=True)
    (config / "Ultralytics" / "settings.json").write_text(json.dumps({"weights_dir": str(weights)}))
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(config))
    check_model("custom.pt")  # Ultralytics looks in its weights_dir for a bare name


def test_a_missing_model_claims_no_run_directory(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        prepare("demo", model=str(tmp_path / "nope.pt"), project=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
