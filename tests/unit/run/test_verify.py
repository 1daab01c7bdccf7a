"""A checkpoint is good only if ``torch.load`` reads it: checked without torch and without running its pickle."""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from helpers import fake_checkpoint
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.supervisor.restart import next_spec


def real_checkpoint(path: Path, epoch: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "epoch": epoch,
            "train_args": {"epochs": 3},
            "model": torch.nn.Linear(8, 4).state_dict(),
            "extra": [torch.ones(3), torch.zeros(2)],
        },
        path,
    )
    return path


def rewrite(src: Path, dst: Path, keep) -> Path:
    """A copy of the zip ``src`` at ``dst`` without the members ``keep`` refuses."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if keep(info):
                zout.writestr(info, zin.read(info.filename))
    return dst


def test_a_checkpoint_torch_loads_is_good(tmp_path):
    path = real_checkpoint(tmp_path / "last.pt")
    assert checkpoints.verify(path) is None and torch.load(path, weights_only=False)["epoch"] == 0


def test_a_well_formed_archive_without_some_tensor_records_is_damaged(tmp_path):
    """What a stop inside torch.save leaves: the zip is finished, but the records written after it are not there."""
    good = real_checkpoint(tmp_path / "good.pt")
    with zipfile.ZipFile(good) as z:
        records = sorted(n for n in z.namelist() if "/data/" in n)
    cut = rewrite(good, tmp_path / "cut.pt", keep=lambda info: info.filename != records[-1])
    with zipfile.ZipFile(cut) as z:
        assert z.testzip() is None  # structure and CRCs are fine: the old check passed it
    try:
        torch.load(cut, weights_only=False)
        raise AssertionError("torch loaded it")
    except RuntimeError:
        pass
    reason = checkpoints.verify(cut)
    assert reason.startswith("incomplete: 1 of its") and "tensor records are missing" in reason


def unknown_method(src: Path, dst: Path) -> Path:
    """``src`` with one byte changed: the first member's compression method, as the central directory records it."""
    data = bytearray(src.read_bytes())
    header = data.index(b"PK\x01\x02")
    data[header + 10] = 99  # a method zipfile does not know
    dst.write_bytes(bytes(data))
    return dst


def test_any_damage_is_a_reason_never_an_exception(tmp_path):
    good = real_checkpoint(tmp_path / "good.pt")
    weird = unknown_method(good, tmp_path / "weird.pt")
    assert checkpoints.verify(weird).startswith("unreadable (NotImplementedError")
    garbage = fake_checkpoint(tmp_path / "garbage.pt", payload=b"not a pickle at all")
    assert checkpoints.verify(garbage).startswith("unreadable (")
    assert checkpoints.verify(tmp_path) == "no such file"  # a directory


def test_resume_and_the_watchdog_fall_back_to_the_verified_copy(tmp_path, spec):
    paths = RunPaths(spec.run_dir)
    real_checkpoint(paths.last_good)
    unknown_method(paths.last_good, paths.last)
    point = checkpoints.plan_resume_point(paths.last)  # plans, changes nothing
    assert point.path == paths.last_good and point.aside == paths.last and paths.last.exists()
    restarted = next_spec(spec, ("fast", "safe"))  # the watchdog's own recovery path
    assert restarted.resume == str(paths.last_good) and (paths.weights / "last.truncated.pt").exists()
