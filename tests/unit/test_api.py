"""``rocm_yolo.train`` speaks Python: its errors and advice name its keywords, Ctrl-C is raised as KeyboardInterrupt
once the tree is gone, bad input is refused before anything starts, and its docstring names every keyword and every
error it raises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rocm_yolo
from rocm_yolo import errors, request
from rocm_yolo.errors import UsageError
from rocm_yolo.run.events import FROM_PYTHON
from rocm_yolo.run.supervisor_state import RunState
from rocm_yolo.supervisor.states import RunResult


def test_an_interrupted_run_raises_keyboard_interrupt_with_its_result(monkeypatch, tmp_path):
    seen = []

    def interrupted(request):
        seen.append(FROM_PYTHON.get())  # the supervisor's advice is given in Python
        return RunResult(state=RunState.INTERRUPTED, exit_code=errors.INTERRUPTED, run_dir=str(tmp_path))

    monkeypatch.setattr(request, "train", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        rocm_yolo.train("d.yaml")
    assert seen == [True] and FROM_PYTHON.get() is False
    assert caught.value.result.exit_code == errors.INTERRUPTED


def test_another_end_is_returned(monkeypatch, tmp_path):
    failed = RunResult(state=RunState.FAILED, exit_code=errors.FAILED, run_dir=str(tmp_path))
    monkeypatch.setattr(request, "train", lambda request: failed)
    assert rocm_yolo.train("d.yaml") is failed


def test_a_missing_model_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UsageError, match=r"model='/nope\.pt': no such file"):
        rocm_yolo.train("demo", model="/nope.pt", project=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_the_docstring_names_every_keyword_and_every_error_the_call_raises():
    """Every field of TrainRequest and every loader setting is a keyword the docstring names; every error class it
    says the call raises is exported from rocm_yolo and named in the README."""
    from dataclasses import fields

    from rocm_yolo.policy.profiles import LOADER_KEYS
    from rocm_yolo.request.train_request import TrainRequest

    doc = rocm_yolo.train.__doc__
    names = {f.name for f in fields(TrainRequest)} - {"overrides"}
    assert sorted(n for n in names | LOADER_KEYS if f"``{n}``" not in doc) == []
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for error in ("UsageError", "SetupError"):
        assert f"rocm_yolo.{error}" in doc and error in rocm_yolo.__all__ and error in readme
        assert issubclass(getattr(rocm_yolo, error), Exception)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        ({"data": "demo", "model": "notes.txt"}, "model='notes.txt'"),
        ({"resume": "/nope/x.pt"}, "resume='/nope/x.pt'"),
        ({"data": "demo", "device": "tpu"}, "device='tpu'"),
        ({"data": "demo", "stall_timeout": 3}, "stall_timeout=3"),
        ({"data": "demo", "checkpoint_every": "3x"}, "checkpoint_every='3x'"),
        ({"data": "demo", "nnodes": 2}, "nnodes=2 needs node_rank=K"),
        ({"data": "demo", "name": "../x"}, "must stay inside project="),
        ({"data": "demo", "max_restarts": -1}, "max_restarts=-1"),
        ({"data": "demo", "fallback": ""}, "fallback= needs at least one profile"),
        ({"data": "demo", "project": 123}, "project=123: give a path (text)"),
        ({"data": "demo", "watchdog": "no"}, "watchdog='no': give True or False"),
        ({"data": None}, "data= is required"),
    ],
)
def test_a_usage_error_from_python_names_the_keywords_not_the_flags(tmp_path, kwargs, keyword):
    with pytest.raises(UsageError) as caught:
        rocm_yolo.train(**{"project": str(tmp_path / "runs"), **kwargs})
    message = str(caught.value)
    assert keyword in message and not re.search(r"(^|\s)--[a-z]", message), message
    assert not (tmp_path / "runs").exists()


def test_a_project_that_cannot_be_made_is_a_setup_error_exported_from_rocm_yolo(tmp_path):
    """/sys refuses a new folder (EPERM as root, EACCES otherwise): what the file system refuses is the environment's
    (a SetupError)."""
    with pytest.raises(rocm_yolo.SetupError) as caught:
        rocm_yolo.train("demo", project="/sys/rocm-yolo-test", device="cpu")
    assert "/sys/rocm-yolo-test" in str(caught.value) and "choose another project=" in str(caught.value)
