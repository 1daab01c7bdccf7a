"""Each epoch's save through the patch: the file replaced whole, a stop during the save carried out after it.

Ultralytics' ``save_model`` needs a whole trainer; here a stand-in method on ``BaseTrainer`` writes the way it does
(``self.last.write_bytes``), so what is under test is the patch's own part: the paths it hands the method, what it
restores, the deferred stop, and that it installs once and uninstalls exactly. The end-to-end test
(tests/e2e/test_e2e_signals.py) stops a real training run in the middle of Ultralytics' own save.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rocm_yolo.patches.saves import epoch_save
from rocm_yolo.process import lifecycle


def test_an_atomic_path_replaces_the_file_whole(tmp_path):
    target = epoch_save.AtomicPath(tmp_path) / "last.pt"
    assert isinstance(target, epoch_save.AtomicPath)
    target.write_bytes(b"old")
    assert target.write_bytes(memoryview(b"new contents")) == len(b"new contents")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary file beside it


@pytest.fixture
def stand_in_save(monkeypatch):
    from ultralytics.engine.trainer import BaseTrainer

    seen = []

    def save_model(self):
        seen.append((type(self.last), type(self.best), type(self.wdir / "epoch1.pt")))
        lifecycle.stop_or_defer(lambda: seen.append("stopped"))  # a SIGTERM in the middle of the save
        seen.append("written")
        self.last.write_bytes(b"checkpoint")

    monkeypatch.setattr(BaseTrainer, "save_model", save_model)
    yield seen
    epoch_save.uninstall()


def test_the_save_writes_atomically_and_a_stop_waits_for_it(tmp_path, stand_in_save):
    from ultralytics.engine.trainer import BaseTrainer

    original = BaseTrainer.__dict__["save_model"]
    epoch_save.install()
    epoch_save.install()  # idempotent
    assert BaseTrainer.save_model.__wrapped__ is original and epoch_save.installed()
    wdir = tmp_path / "weights"
    wdir.mkdir()
    trainer = SimpleNamespace(last=wdir / "last.pt", best=wdir / "best.pt", wdir=wdir)
    BaseTrainer.save_model(trainer)
    assert stand_in_save == [(epoch_save.AtomicPath,) * 3, "written", "stopped"]
    assert (wdir / "last.pt").read_bytes() == b"checkpoint"
    assert (trainer.last, trainer.best, trainer.wdir) == (wdir / "last.pt", wdir / "best.pt", wdir)
    assert type(trainer.last) is type(wdir)  # the trainer's own paths back
    epoch_save.uninstall()
    assert BaseTrainer.__dict__["save_model"] is original and not epoch_save.installed()


def test_a_stop_outside_a_save_is_carried_out_at_once():
    seen = []
    lifecycle.stop_or_defer(lambda: seen.append("stopped"))
    assert seen == ["stopped"]
    with lifecycle.uninterrupted():
        with lifecycle.uninterrupted():
            lifecycle.stop_or_defer(lambda: seen.append("first"))
            lifecycle.stop_or_defer(lambda: seen.append("second"))
        assert seen == ["stopped"]  # the outer block is still in progress
    assert seen == ["stopped", "first"]  # once, when the outermost block ends
