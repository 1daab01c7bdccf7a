"""A model Ultralytics cannot load is bad input: one line before anything starts; what Ultralytics finds or
downloads by name is left to it."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import pytest

from helpers import fake_checkpoint, prepare
from rocm_yolo.errors import UsageError
from rocm_yolo.request.data_path import check_model


@pytest.mark.parametrize(
    "model",
    [
        "yolo26n.pt",  # an asset Ultralytics downloads
        "yolo26n-seg.pt",
        "weights/yolo11n.pt",  # downloaded into the directory given
        "yolo26n.yaml",  # built from Ultralytics' config (yolo26.yaml at scale n)
        "yolo26s-cls.yaml",
        "yolov8n6.yaml",  # renamed yolov8n-p6.yaml by Ultralytics
        "yolov5n.pt",  # downloaded as yolov5nu.pt
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
        ("yolo26q.pt", "no such file, and no model Ultralytics downloads by that name (did you mean yolo26"),
    ],
)
def test_a_model_that_is_not_there_is_refused_in_one_line(model, why):
    with pytest.raises(UsageError) as caught:
        check_model(model)
    assert why in str(caught.value) and "\n" not in str(caught.value) and "yolo26n.pt" in str(caught.value)


def ultralytics_checkpoint(path: Path) -> Path:
    """A file as Ultralytics' save_model lays one out (a zip with a data.pkl naming its model), without tensors."""
    return fake_checkpoint(path, pickle.dumps({"epoch": 0, "model": None, "ema": {"yaml": {}}, "train_args": {}}))


def test_a_file_that_is_there_and_ultralytics_weights_dir_are_taken(tmp_path, monkeypatch):
    mine = ultralytics_checkpoint(tmp_path / "mine.pt")
    check_model(str(mine))
    weights = tmp_path / "w"
    ultralytics_checkpoint(weights / "custom.pt")
    config = tmp_path / "cfg"
    (config / "Ultralytics").mkdir(parents=True)
    (config / "Ultralytics" / "settings.json").write_text(json.dumps({"weights_dir": str(weights)}))
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(config))
    check_model("custom.pt")  # Ultralytics looks in its weights_dir for a bare name
    (weights / "custom.pt").write_text("not a checkpoint")
    with pytest.raises(UsageError, match="custom.pt: not a torch checkpoint"):
        check_model("custom.pt")


def test_a_real_checkpoint_and_torchs_legacy_format_are_taken_a_state_dict_is_not(tmp_path):
    """Read from the structure torch.load reads (the zip directory, the pickle it names), never the tensors."""
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(2, 2)
    torch.save({"epoch": -1, "model": net, "ema": None, "train_args": {}}, tmp_path / "stripped.pt")
    check_model(str(tmp_path / "stripped.pt"))
    torch.save({"model": net}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    check_model(str(tmp_path / "legacy.pt"))
    torch.save(net.state_dict(), tmp_path / "state.pt")
    with pytest.raises(UsageError, match="state.pt: a torch file with no Ultralytics model in it"):
        check_model(str(tmp_path / "state.pt"))


@pytest.mark.parametrize(
    "name, content, why",
    [
        ("notes.txt", b"my notes", "rocm-yolo trains a .pt checkpoint or a .yaml model definition, not a .txt file"),
        ("model.onnx", b"\x08\x07", "not a .onnx file (Ultralytics trains nothing else"),
        ("mymodel.pt", b"my notes", "mymodel.pt: not a torch checkpoint (no zip archive, or one cut short)"),
        ("empty.pt", b"", "empty.pt: an empty file"),
        ("data.yaml", b"path: x\ntrain: a\nval: b\nnames: {0: a}\n", "a dataset YAML, not a model definition"),
        ("odd.yaml", b"just: text\n", "no model definition (a model YAML has backbone: and head:)"),
    ],
)
def test_a_file_that_is_no_model_is_refused_in_one_line(tmp_path, name, content, why):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UsageError) as caught:
        check_model(str(tmp_path / name))
    assert why in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_zip_that_is_no_checkpoint_and_a_directory_are_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "z.pt", "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(UsageError, match="z.pt: a zip archive, but no torch checkpoint"):
        check_model(str(tmp_path / "z.pt"))
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(UsageError, match="a directory"):
        check_model(str(tmp_path / "dir.pt"))


def test_a_misspelt_model_file_is_told_the_one_beside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ultralytics_checkpoint(tmp_path / "best.pt")
    with pytest.raises(UsageError, match=r"--model bset.pt: no such file \(did you mean best.pt\?\)"):
        check_model("bset.pt")


def test_a_missing_model_claims_no_run_directory(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        prepare("demo", model=str(tmp_path / "nope.pt"), project=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
