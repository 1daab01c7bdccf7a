"""Checkpoint files without training: verification, the verified copy, and which one a resume takes."""

from __future__ import annotations

import os
import time

import pytest

from helpers import fake_checkpoint
from rocm_yolo.errors import UsageError
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths


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


def test_the_newest_valid_checkpoint_is_chosen(tmp_path):
    paths = RunPaths(tmp_path / "run")
    last = fake_checkpoint(paths.last, age=100)
    fake_checkpoint(paths.mid_checkpoint(2, 10), age=50)
    mid = fake_checkpoint(paths.mid_checkpoint(2, 20), age=40)
    assert checkpoints.choose_resume_point(last)[0] == mid
    mid.write_bytes(mid.read_bytes()[:60])  # damaged (cannot happen with atomic writes, but a disk can fail)
    path, note = checkpoints.choose_resume_point(last)
    assert path == paths.mid_checkpoint(2, 10) and "skipped the mid-epoch checkpoint ep2-ba20.pt" in note
    fake_checkpoint(last, age=0)  # the epoch ended and was saved, but its mid-epoch files were not yet removed
    assert checkpoints.choose_resume_point(last) == (
        last,
        "skipped the mid-epoch checkpoint ep2-ba20.pt: truncated or not a torch checkpoint",
    )
    removed = checkpoints.remove_mid_checkpoints(paths, through_epoch=2)
    assert sorted(p.name for p in removed) == ["ep2-ba10.pt", "ep2-ba20.pt"] and paths.mid_checkpoints() == []


def test_a_run_with_only_mid_epoch_checkpoints_is_found_and_resumable(tmp_path):
    paths = RunPaths(tmp_path / "runs" / "detect" / "train")
    mid = fake_checkpoint(paths.mid_checkpoint(1, 500))  # a hang in the first epoch: no last.pt yet
    assert checkpoints.find_latest(tmp_path / "runs") == paths.last
    assert checkpoints.choose_resume_point(paths.last)[0] == mid
    assert checkpoints.is_mid_checkpoint(mid) and not checkpoints.is_mid_checkpoint(paths.last)


def test_the_verified_copy_of_a_file_only_ever_replaced_is_a_hard_link(tmp_path, monkeypatch):
    """Issue 43: the saves replace last.pt whole, so its verified copy is the same file under a second name (no byte
    written); the next save's new last.pt leaves it as it was. Where no link can be made, it is a copy; a file that
    does not verify is not kept, and the previous copy stays."""
    last = fake_checkpoint(tmp_path / "weights" / "last.pt")
    good = checkpoints.keep_good_copy(last, link=True)
    assert good.name == "last_good.pt" and os.path.samefile(last, good) and os.stat(last).st_nlink == 2
    kept = good.read_bytes()
    new = fake_checkpoint(tmp_path / "weights" / "new.pt", age=0)
    os.replace(new, last)  # the next save: a new file in last.pt's place
    assert good.read_bytes() == kept and not os.path.samefile(last, good) and os.stat(good).st_nlink == 1
    (tmp_path / "weights" / "cut.pt").write_bytes(last.read_bytes()[:100])
    os.replace(tmp_path / "weights" / "cut.pt", last)
    assert checkpoints.keep_good_copy(last, link=True) is None and good.read_bytes() == kept  # the previous one stays
    assert [p.name for p in (tmp_path / "weights").iterdir() if p.name.startswith(".")] == []  # no link left behind

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")  # a file system without hard links

    fake_checkpoint(last)
    monkeypatch.setattr(os, "link", no_links)
    good = checkpoints.keep_good_copy(last, link=True)
    assert good.read_bytes() == last.read_bytes() and not os.path.samefile(last, good)
