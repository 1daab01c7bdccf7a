"""``--checkpoint-every``: how often the trainer writes a mid-epoch checkpoint, and its default.

Parsed in the CLI (which must not import torch) and again in the training child from the
spec, so both read the same text the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rocm_yolo.errors import UsageError

DEFAULT_CHECKPOINT_INTERVAL = "10m"
_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|ba)$")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class CheckpointInterval:
    """How often to write a mid-epoch checkpoint: every ``seconds`` or every ``batches``; neither: off."""

    text: str
    seconds: float | None = None
    batches: int | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.seconds or self.batches)

    def describe(self) -> str:
        if self.batches:
            return f"every {self.batches} batches"
        if self.seconds:
            return f"every {self.text}"
        return "off"


def parse_interval(value: object) -> CheckpointInterval:
    """``--checkpoint-every``: ``Ns``, ``Nm``, ``Nh``, ``Nba`` (batches) or ``0`` (off).

    Raises :class:`UsageError` with one line that says what is accepted.
    """
    text = str(value).strip().lower() if value is not None else ""
    if text in ("0", "0.0", "off") or value == 0:
        return CheckpointInterval("0")
    m = _INTERVAL.match(text)
    if m is None or float(m[1]) <= 0 or (m[2] == "ba" and not m[1].isdigit()):
        raise UsageError(
            f"--checkpoint-every {value}: write a time (30s, 10m, 1.5h), a number of batches (500ba), "
            "or 0 to turn mid-epoch checkpoints off"
        )
    number, unit = m[1], m[2]
    if unit == "ba":
        return CheckpointInterval(text, batches=int(number))
    return CheckpointInterval(text, seconds=float(number) * _SECONDS[unit])
