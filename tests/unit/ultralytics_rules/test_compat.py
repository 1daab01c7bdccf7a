"""The Ultralytics and torch internals rocm-yolo relies on: listed once, checked at start-up."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rocm_yolo.errors import SetupError
from rocm_yolo.ultralytics_rules import compat


def test_the_installed_versions_meet_every_requirement():
    assert compat.missing() == [] and compat.check() == []


def test_a_missing_essential_internal_is_a_setup_error_naming_version_and_feature(monkeypatch):
    callbacks = next(r for r in compat.REQUIREMENTS if r.what.startswith("trainer callbacks"))
    gone = dataclasses.replace(callbacks, present=lambda: False)
    monkeypatch.setattr(compat, "REQUIREMENTS", tuple(gone if r is callbacks else r for r in compat.REQUIREMENTS))
    with pytest.raises(SetupError) as e:
        compat.check()
    text = str(e.value)
    assert re.search(r"ultralytics \d+\.\d+\.\d+ lacks trainer callbacks", text)
    assert "the heartbeat and the watchdog" in text and compat.SUPPORTED_ULTRALYTICS in text


def test_a_missing_degradable_internal_is_a_warning_saying_which_feature_is_off(monkeypatch):
    def broken():
        raise AttributeError("moved")  # a changed internal may fail any way

    reset = next(r for r in compat.REQUIREMENTS if "reset()" in r.what)
    monkeypatch.setattr(compat, "REQUIREMENTS", (dataclasses.replace(reset, present=broken),))
    [warning] = compat.check()
    assert "InfiniteDataLoader.reset()" in warning and "fresh workers every epoch" in warning and "is off" in warning


def test_a_renamed_user_input_check_is_caught(monkeypatch):
    """attempt_load_one_weight was such a name: Ultralytics renamed it load_checkpoint."""
    from rocm_yolo.ultralytics_rules import user_checks

    checks = compat._user_checks
    assert checks()
    monkeypatch.setitem(user_checks.USER_CHECKS, "ultralytics.nn.tasks", ("attempt_load_one_weight",))
    assert not checks()
    monkeypatch.setitem(user_checks.USER_CHECKS, "ultralytics.nn.tasks", ("load_checkpoint",))
    monkeypatch.setitem(user_checks.USER_CHECKS, "ultralytics.data.dataset", ("verify_labels",))
    assert checks()  # a method of one of the module's classes (YOLODataset.verify_labels)


def test_an_ultralytics_outside_the_tested_range_is_a_warning(monkeypatch):
    import ultralytics

    low, high = (bound.lstrip("<>=") for bound in compat.SUPPORTED_ULTRALYTICS.split(","))
    assert compat.untested(low) is None and compat.untested(high) is None and compat.untested(f"{high}+rocm") is None
    major, minor, patch = map(int, low.split("."))
    older = f"{major}.{minor}.{patch - 1}"
    monkeypatch.setattr(ultralytics, "__version__", older)
    [warning] = compat.check()
    assert f"ultralytics {older} is outside the tested range {compat.SUPPORTED_ULTRALYTICS}" in warning
    assert compat.untested("8.5.0") and compat.untested("?")


def test_a_torch_older_than_the_tested_ones_is_a_warning(monkeypatch):
    import torch

    from rocm_yolo.ultralytics_rules.versions import TESTED_TORCH, untested_torch

    assert untested_torch(TESTED_TORCH) is None and untested_torch(f"{TESTED_TORCH}.0+rocm7.1") is None
    assert untested_torch("2.15.0") is None and untested_torch("10.0") is None
    monkeypatch.setattr(torch, "__version__", "2.10.0+rocm7.13.0")
    warnings = compat.check()
    assert [w for w in warnings if w.startswith("torch 2.10.0+rocm7.13.0 is older than") and TESTED_TORCH in w]


def test_pyproject_declares_the_tested_range():
    text = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    assert f'"ultralytics{compat.SUPPORTED_ULTRALYTICS}"' in text
    # Python: CI's 3.11 and the lent GPU's 3.12 (docs/speed.md); torch: AMD's ROCm wheels' 2.10, said at start-up
    assert 'requires-python = ">=3.11"' in text and '"torch>=2.10"' in text


def test_readme_and_ci_run_the_lowerbound_tests_against_the_lower_bound():
    root = Path(__file__).resolve().parents[3]
    low = compat.SUPPORTED_ULTRALYTICS.split(",")[0].lstrip(">=")
    readme = (root / "CONTRIBUTING.md").read_text()
    assert (
        f'"ultralytics=={low}"' in readme
        and f"ROCM_YOLO_EXPECT_ULTRALYTICS={low} python -m pytest -q -m lowerbound" in readme
    )
    ci = (root / ".ci" / "run").read_text()  # reads the bound from compat
    assert (
        "from rocm_yolo.ultralytics_rules.versions import SUPPORTED_ULTRALYTICS" in ci
        and "python -m pytest -q -m lowerbound" in ci
    )


def test_this_ultralytics_has_every_internal_mid_epoch_resume_needs():
    assert compat.missing_for(compat.MID_EPOCH_FEATURE) == []
