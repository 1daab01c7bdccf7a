"""End to end (issue 43): a new user's first hour, on a machine with no network, told true.

Each input a new user got wrong, tried as they tried it: the README's own ``rocm-yolo train data.yaml`` with no such
file, a typo beside a local model, a text file as the model, a GPU the machine does not have, a detection layout
given where classification is the default, ``profile=safe``, and the same calls from Python. Each is refused before
anything starts: one line that names the input and the fix, exit 2 (from Python a UsageError, its line in Python's
words), no traceback, nothing under ``runs/``, and no process started: the CLI is watched while it runs and every
process it starts is recorded (a training process imports torch for seconds: it cannot slip by).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import TINY, Cli, rocm_lines
from rocm_yolo import errors
from rocm_yolo.gpu.count import device_files

SEAM_TOPOLOGY = Path(__file__).resolve().parents[1] / "seams" / "kfd" / "nodes"  # a machine of two gfx1100 GPUs
NO_MODEL = [a for a in TINY if a not in ("--model", "yolo26n.yaml")]


def refused(cli: Cli, where: Path, *args: str, env: dict | None = None, python: str | None = None) -> str:
    """Run the command and hold it to a refusal before anything starts; its one line."""
    r, started = cli.refused(*args, env=env, python=python, timeout=120)
    output = r.stdout
    assert started == [], f"processes started: {started}\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    assert not (where / "runs").exists(), output[-3000:]
    assert cli.leftovers() == []
    if python is not None:
        assert r.returncode == 0, output[-3000:]
        return output.strip().splitlines()[-1]
    assert r.returncode == errors.USAGE, output[-3000:]
    lines = rocm_lines(output)
    assert len(lines) == 1 and output.strip() == lines[0], output[-3000:]
    return lines[0]


@pytest.mark.parametrize("data", ["data.yaml", "./data.yaml"])
def test_the_readmes_own_example_with_no_such_file_names_the_file(cli, tmp_path, data):
    """It started a training process that tried to download yolo26n.pt, exited 4 naming the model, not the data,
    and left runs/detect/train (the next try landed in train-2)."""
    line = refused(cli, tmp_path, "train", data)
    assert line.startswith(f"rocm-yolo: error: data file not found: {data}: give the path of your dataset YAML")
    assert "coco8.yaml" in line and "'demo'" in line
    line = refused(cli, tmp_path, "train", data)  # and again: still nothing made
    assert "data file not found" in line


def test_a_typo_beside_a_local_model_is_told_the_file_it_meant(cli, tmp_path, tiny_data):
    """``dta.yaml --model yolo26n.yaml``: a child started and exited 2 after 4-7 s with "'dta.yaml' does not exist"."""
    shutil.copy(tiny_data, tmp_path / "data.yaml")
    line = refused(cli, tmp_path, "train", "dta.yaml", *TINY)
    assert "data file not found: dta.yaml (did you mean data.yaml?)" in line


@pytest.mark.parametrize(
    "name, content, said",
    [
        (
            "notes.txt",
            b"my notes\n",
            "--model notes.txt: rocm-yolo trains a .pt checkpoint or a .yaml model definition",
        ),
        ("mymodel.pt", b"my notes\n", "--model mymodel.pt: not a torch checkpoint (no zip archive, or one cut short)"),
    ],
)
def test_a_file_that_is_no_model_is_refused_before_anything_starts(cli, tmp_path, tiny_data, name, content, said):
    """notes.txt was an internal error (exit 123) with a run directory left; the same text as mymodel.pt exit 2 only
    after a child started, in Ultralytics' words ("error: ERROR ...")."""
    (tmp_path / name).write_bytes(content)
    line = refused(cli, tmp_path, "train", str(tiny_data), "--model", name, *NO_MODEL)
    assert said in line and "yolo26n" in line and "ERROR" not in line


def test_a_misspelt_model_name_is_not_downloaded(cli, tmp_path, tiny_data):
    """A name of Ultralytics' kind that is not among the models it downloads (its own list): refused here, offline or
    not, not after a training process tried to download it."""
    line = refused(cli, tmp_path, "train", str(tiny_data), "--model", "yolo26q.pt", *NO_MODEL)
    assert "--model yolo26q.pt: no such file, and no model Ultralytics downloads by that name" in line


@pytest.mark.parametrize("device", ["7", "2", "0,1,2"])
def test_a_gpu_the_machine_does_not_have_is_refused_as_a_list_is(cli, tmp_path, tiny_data, device):
    """On a machine of two GPUs (the seam's KFD topology, read as rocm-yolo reads an AMD machine's): one id is checked
    as a list of them is; ``--device 7`` started a child that exited 2 with Ultralytics' message."""
    cli.env["ROCM_YOLO_KFD_ROOT"] = str(SEAM_TOPOLOGY)
    cli.env.pop("ROCR_VISIBLE_DEVICES", None)
    args = ("train", str(tiny_data), *NO_MODEL, "--device", device, "--batch", "6", "--model", "yolo26n.yaml")
    line = refused(cli, tmp_path, *args)
    assert f"--device {device} names GPU {max(device.split(','))}, but this machine shows" in line
    assert "name GPUs it has, e.g. --device" in line


@pytest.mark.skipif(bool(device_files()), reason=f"this machine has a GPU runtime's device file: {device_files()}")
def test_on_a_machine_without_a_gpu_device_0_is_refused(cli, tmp_path, tiny_data):
    line = refused(cli, tmp_path, "train", str(tiny_data), "--model", "yolo26n.yaml", "--device", "0")
    assert "--device 0: this machine shows no GPU to a run" in line and "--device cpu" in line


def test_a_detection_layout_given_to_the_classification_default_is_told_to_use_a_yaml(cli, tmp_path):
    """``rocm-yolo train mydata`` with images/ and labels/ was told to lay it out as classification class folders."""
    for split in ("train", "val"):
        (tmp_path / "mydata" / "images" / split).mkdir(parents=True)
        (tmp_path / "mydata" / "labels" / split).mkdir(parents=True)
    line = refused(cli, tmp_path, "train", "mydata")
    assert "data mydata is laid out for detection (images/ beside labels/)" in line
    assert "train: images/train, val: images/val" in line and "class folders" in line


def test_profile_as_key_value_is_told_it_is_the_profile_option(cli, tmp_path, tiny_data):
    """``profile=safe`` was read as Ultralytics' profile switch ("not a boolean")."""
    line = refused(cli, tmp_path, "train", str(tiny_data), *TINY, "profile=safe")
    assert "profile=safe: rocm-yolo's settings profile is --profile safe" in line and "True or False" in line


PYTHON = """
import json, rocm_yolo
try:
    rocm_yolo.train(**json.loads({kwargs!r}))
except (rocm_yolo.UsageError, rocm_yolo.SetupError) as e:
    print(type(e).__name__, "|", e)
"""


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"data": "dta.yaml", "model": "yolo26n.yaml"}, "UsageError | data file not found: dta.yaml"),
        ({"data": "DATA", "model": "notes.txt"}, "UsageError | model='notes.txt': rocm-yolo trains a .pt checkpoint"),
        ({"resume": "nope/x.pt"}, "UsageError | resume='nope/x.pt': a resume continues a run"),
        ({"data": "DATA", "project": "/sys/rocm-yolo-test"}, "SetupError | cannot create the project directory"),
    ],
)
def test_from_python_each_is_an_exception_in_pythons_words(cli, tmp_path, tiny_data, kwargs, said):
    """From Python a missing data file returned exit_code=2 after a child ran; the errors advised --resume,
    --project and --model; a read-only project raised a SetupError that rocm_yolo did not export."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    kwargs = {k: str(tiny_data) if v == "DATA" else v for k, v in kwargs.items()}
    kwargs.update(device="cpu", imgsz=32, batch=4)
    line = refused(cli, tmp_path, python=PYTHON.format(kwargs=json.dumps(kwargs)))
    assert line.startswith(said), line
    assert " --" not in line, line
