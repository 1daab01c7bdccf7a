"""Checkpoint verification and the resume spec, without training (fake checkpoints, real files)."""

import os
import time
import zipfile
from pathlib import Path

import pytest

from rocm_yolo import checkpoints, launch
from rocm_yolo.errors import UsageError


def fake_checkpoint(path: Path, payload: bytes = b"x" * 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("last/data.pkl", payload)
    return path


def test_verify_tells_complete_from_truncated(tmp_path):
    good = fake_checkpoint(tmp_path / "a.pt")
    assert checkpoints.verify(good) is None
    data = good.read_bytes()
    (tmp_path / "t.pt").write_bytes(data[: len(data) // 2])
    assert "truncated" in checkpoints.verify(tmp_path / "t.pt")
    (tmp_path / "e.pt").write_bytes(b"")
    assert checkpoints.verify(tmp_path / "e.pt") == "empty file"
    assert checkpoints.verify(tmp_path / "missing.pt") == "no such file"


def test_keep_good_copy_and_choose_resume(tmp_path):
    last = fake_checkpoint(tmp_path / "weights" / "last.pt")
    good = checkpoints.keep_good_copy(last)
    assert good.name == "last_good.pt" and good.read_bytes() == last.read_bytes()
    assert checkpoints.choose_resume(last) == (last, None)
    last.write_bytes(last.read_bytes()[:100])  # a kill in the middle of the next save
    path, note = checkpoints.choose_resume(last)
    assert path == good and "resuming from the verified copy" in note
    assert not last.exists() and (tmp_path / "weights" / "last.truncated.pt").exists()  # kept, not deleted
    good.unlink()
    with pytest.raises(UsageError, match="checkpoint not found"):
        checkpoints.choose_resume(last)


def test_find_latest_sees_a_run_left_with_only_its_verified_copy(tmp_path):
    a = fake_checkpoint(tmp_path / "runs" / "a" / "weights" / "last.pt")
    b = fake_checkpoint(tmp_path / "runs" / "b" / "weights" / "last_good.pt")
    os.utime(a, (time.time() - 100, time.time() - 100))
    assert checkpoints.find_latest(tmp_path / "runs") == b.with_name("last.pt")
    path, note = checkpoints.choose_resume(checkpoints.find_latest(tmp_path / "runs"))
    assert path == b and note


def _first_run(tiny_data, project, **extra):
    spec = launch.make_spec(str(tiny_data), project=str(project), model="yolo26n.yaml", workers=2, extra=extra)
    spec.save()
    fake_checkpoint(Path(spec.run_dir) / "weights" / "last.pt")
    return spec


def test_a_bare_resume_keeps_the_runs_own_settings(tiny_data, tmp_path):
    first = _first_run(tiny_data, tmp_path, val=False, timeout=60, pin_memory=False)
    again = launch.make_spec(resume=str(Path(first.run_dir) / "weights" / "last.pt"))
    assert again.profile == "fast" and again.loader.workers == 2 and again.attempt == 2
    assert again.val is False and again.loader.timeout == 60 and again.loader.pin_memory is False
    assert again.run_dir == first.run_dir and again.resume.endswith("last.pt")


def test_a_resume_on_another_profile_takes_that_profiles_settings(tiny_data, tmp_path):
    first = _first_run(tiny_data, tmp_path, val=False, timeout=60)
    again = launch.make_spec(resume=True, project=str(tmp_path), profile="single")
    assert again.profile == "single" and again.loader.workers == 0 and again.val is True
    assert "resume changes the profile: fast -> single" in again.notes
    assert again.run_dir == first.run_dir
