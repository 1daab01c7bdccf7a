"""``--checkpoint-every``: the forms it takes and the one line it says about the others."""

from __future__ import annotations

import pytest

from rocm_yolo.errors import UsageError
from rocm_yolo.run.midepoch_state import parse_interval


@pytest.mark.parametrize(
    "text, seconds, batches",
    [
        ("10m", 600, None),
        ("30s", 30, None),
        ("1.5h", 5400, None),
        ("500ba", None, 500),
        ("0", None, None),
        (0, None, None),
    ],
)
def test_interval_forms(text, seconds, batches):
    interval = parse_interval(text)
    assert (interval.seconds, interval.batches) == (seconds, batches)
    assert interval.enabled == bool(seconds or batches)


@pytest.mark.parametrize("text", ["10x", "-1m", "m", "1.5ba", "10", "0ba", ""])
def test_bad_intervals_say_what_is_accepted(text):
    with pytest.raises(UsageError, match="write a time .* a number of batches .* or 0"):
        parse_interval(text)
