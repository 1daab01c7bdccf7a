"""The mid-epoch position record: what it keeps on disk, what it refuses, and when a position means nothing."""

from __future__ import annotations

import pytest

from rocm_yolo.run.midepoch_state import FORMAT, MID_EPOCH_KEY, FormatError, MidEpochState, has_position

STATE = MidEpochState(
    epoch=1,
    batch=3,
    batches=8,
    samples=32,
    batch_size=4,
    ni=11,
    last_opt_step=10,
    model={"w": 1.0},
    grads={},
    tloss=None,
    stopper={"best_epoch": 0},
    rng={"python": None},
    sampler_state={"epoch": 1},
    skip=12,
    requested={"batch": -1, "imgsz": 600},
)


def test_the_record_keeps_its_on_disk_layout_and_reads_back():
    d = STATE.to_dict()
    assert d["format"] == FORMAT and d["sampler"] == {"state": {"epoch": 1}, "skip": 12} and "skip" not in d
    assert MidEpochState.from_dict(d) == STATE
    assert MidEpochState.of({MID_EPOCH_KEY: d}) == STATE and MidEpochState.of({"epoch": 3}) is None
    assert has_position({MID_EPOCH_KEY: d}) and not has_position({"epoch": 3})


def test_another_format_or_a_damaged_record_is_refused_with_the_reason():
    with pytest.raises(FormatError, match="position format 2, this one reads 1"):
        MidEpochState.from_dict({**STATE.to_dict(), "format": 2})
    damaged = STATE.to_dict()
    del damaged["ni"]
    with pytest.raises(FormatError, match="lacks ni"):
        MidEpochState.from_dict(damaged)
    with pytest.raises(FormatError):
        MidEpochState.from_dict("not a record")


def test_a_position_survives_autobatch_and_imgsz_rounding_but_not_a_real_change():
    """Ultralytics stores what it used (AutoBatch's 16 for batch=-1, 608 for imgsz=600): asking again
    for what the run asked for is no change; another batch or imgsz is."""
    saved = {"batch": 16, "imgsz": 608}
    assert STATE.mismatch(saved, {"batch": -1, "imgsz": 600}) is None  # a restart asks for the same
    assert STATE.mismatch(saved, {"batch": 16, "imgsz": 608}) is None  # what it used
    assert STATE.mismatch(saved, {"batch": 8}) == "batch 16 -> 8"
    assert STATE.mismatch(saved, {"imgsz": 640}) == "imgsz 608 -> 640"
    old = MidEpochState.from_dict({k: v for k, v in STATE.to_dict().items() if k != "requested"})  # before it
    assert old.mismatch({"batch": 16}, {"batch": 16}) is None
    assert old.mismatch({"batch": 16}, {"batch": 4}) == "batch 16 -> 4"
