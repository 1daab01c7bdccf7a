"""The atomic end-of-training rewrite, in-process: Ultralytics' own ``strip_optimizer`` through the patch.

It installs once and uninstalls exactly; the stripped checkpoint replaces the file whole (no
temporary file left beside it); Ultralytics' log line names the file the user sees, as it does
without the patch; a file that is no Ultralytics checkpoint is left as it was.
"""

from __future__ import annotations

import logging

import torch

from rocm_yolo.patches.saves import final_save


def _checkpoint(path):
    torch.save({"model": torch.nn.Linear(2, 2), "optimizer": {"state": 1}, "epoch": 3, "train_args": {}}, path)


def test_strip_optimizer_rewrites_whole_and_logs_the_real_name(tmp_path, caplog):
    import ultralytics.engine.trainer as trainer

    original = trainer.strip_optimizer
    last = tmp_path / "weights/last.pt"
    last.parent.mkdir()
    _checkpoint(last)
    final_save.install(tmp_path)
    final_save.install(tmp_path)  # idempotent
    try:
        assert trainer.strip_optimizer.__wrapped__ is original
        logger = logging.getLogger("ultralytics")
        logger.addHandler(caplog.handler)
        try:
            trainer.strip_optimizer(last)
        finally:
            logger.removeHandler(caplog.handler)
    finally:
        final_save.uninstall()
    assert trainer.strip_optimizer is original and not final_save.installed()
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["optimizer"] is None and ckpt["epoch"] == -1
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt"]
    lines = [r.getMessage() for r in caplog.records if "Optimizer stripped" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"Optimizer stripped from {last}, ") and ".tmp" not in lines[0]
    assert "saved as" not in lines[0]


def test_a_file_that_is_no_checkpoint_is_left_alone(tmp_path):
    import ultralytics.engine.trainer as trainer

    odd = tmp_path / "weights/best.pt"
    odd.parent.mkdir()
    odd.write_bytes(b"not a checkpoint")
    final_save.install(tmp_path)
    try:
        assert trainer.strip_optimizer(odd) == {}
    finally:
        final_save.uninstall()
    assert odd.read_bytes() == b"not a checkpoint" and sorted(p.name for p in odd.parent.iterdir()) == ["best.pt"]


def test_a_link_planted_where_the_rewrite_goes_is_removed_not_written_through(tmp_path):
    """weights/ follows the user's umask (group-writable under 002): a link planted under the temporary's name (the
    writer's pid is no secret) would have taken torch.save's bytes (issue 45)."""
    import ultralytics.engine.trainer as trainer

    from rocm_yolo.run.atomic import temporary

    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    best = tmp_path / "weights/best.pt"
    best.parent.mkdir()
    _checkpoint(best)
    temporary(best).symlink_to(victim)
    final_save.install(tmp_path)
    try:
        trainer.strip_optimizer(best)
    finally:
        final_save.uninstall()
    assert victim.read_text() == "the user's file" and torch.load(best, weights_only=False)["optimizer"] is None
    assert sorted(p.name for p in best.parent.iterdir()) == ["best.pt"]
