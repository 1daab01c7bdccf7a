"""``rocm_yolo.train`` speaks Python: its advice in Python, Ctrl-C raised as KeyboardInterrupt once the tree is gone,
a missing model refused before anything starts."""

from __future__ import annotations

import pytest

import rocm_yolo
from rocm_yolo import errors, launch
from rocm_yolo.errors import UsageError
from rocm_yolo.run.events import FROM_PYTHON
from rocm_yolo.run.supervisor_state import State
from rocm_yolo.supervisor.states import RunResult


def test_an_interrupted_run_raises_keyboard_interrupt_with_its_result(monkeypatch, tmp_path):
    seen = []

    def interrupted(request):
        seen.append(FROM_PYTHON.get())  # the supervisor's advice is given in Python
        return RunResult(state=State.INTERRUPTED, exit_code=errors.INTERRUPTED, run_dir=str(tmp_path))

    monkeypatch.setattr(launch, "train", interrupted)
    with pytest.raises(KeyboardInterrupt) as caught:
        rocm_yolo.train("d.yaml")
    assert seen == [True] and FROM_PYTHON.get() is False
    assert caught.value.result.exit_code == errors.INTERRUPTED


def test_another_end_is_returned(monkeypatch, tmp_path):
    failed = RunResult(state=State.FAILED, exit_code=errors.FAILED, run_dir=str(tmp_path))
    monkeypatch.setattr(launch, "train", lambda request: failed)
    assert rocm_yolo.train("d.yaml") is failed


def test_a_missing_model_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UsageError, match=r"--model /nope\.pt: no such file"):
        rocm_yolo.train("demo", model="/nope.pt", project=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
