"""What a mid-epoch checkpoint's position means, and when it means nothing."""

from __future__ import annotations

from rocm_yolo.run import checkpoints


def test_a_position_survives_autobatch_and_imgsz_rounding_but_not_a_real_change():
    """Ultralytics stores what it used (AutoBatch's 16 for batch=-1, 608 for imgsz=600): asking again
    for what the run asked for is no change; another batch or imgsz is."""
    from rocm_yolo.trainer.checkpoint_state import position_mismatch

    ckpt = {
        "train_args": {"batch": 16, "imgsz": 608},
        checkpoints.MID_EPOCH_KEY: {"batch": 3, "requested": {"batch": -1, "imgsz": 600}},
    }
    assert position_mismatch(ckpt, {"batch": -1, "imgsz": 600}) is None  # a restart asks for the same
    assert position_mismatch(ckpt, {"batch": 16, "imgsz": 608}) is None  # what it used
    assert position_mismatch(ckpt, {"batch": 8}) == "batch 16 -> 8"
    assert position_mismatch(ckpt, {"imgsz": 640}) == "imgsz 608 -> 640"
    old = {"train_args": {"batch": 16}, checkpoints.MID_EPOCH_KEY: {"batch": 3}}  # written before "requested"
    assert position_mismatch(old, {"batch": 16}) is None and position_mismatch(old, {"batch": 4}) == "batch 16 -> 4"
    assert position_mismatch({"train_args": {"batch": 16}}, {"batch": 4}) is None  # not a mid-epoch checkpoint
