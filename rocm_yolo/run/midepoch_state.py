"""Mid-epoch checkpoints: how often the trainer writes one (``--checkpoint-every``), and rocm-yolo's record inside
one, under :data:`MID_EPOCH_KEY`.

The interval (:func:`parse_interval`; its default is ``--checkpoint-every``'s,
:class:`~rocm_yolo.request.train_request.TrainRequest`) is parsed in the CLI (which must not import torch) and again
in the training child from the spec, so both read the same text the same way.

A mid-epoch checkpoint (``weights/ep{E}-ba{B}.pt``) is an Ultralytics checkpoint (``YOLO(path)`` loads
it anywhere) with one key of rocm-yolo's own: :class:`MidEpochState`, where the epoch is and
everything that continues it at the next batch as if the run had never stopped. On disk it is a
plain dict of plain types and tensors (:meth:`MidEpochState.to_dict`), so a checkpoint never names
a rocm-yolo class; :meth:`MidEpochState.from_dict` reads it back and refuses another
:data:`FORMAT`. The trainer writes it (:mod:`rocm_yolo.trainer.midepoch.save`) and continues
from it (:mod:`rocm_yolo.trainer.midepoch.restore`); the rest of rocm-yolo only asks whether
a checkpoint has one. Torch-free: the values are whatever the trainer put in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from rocm_yolo.errors import UsageError, option
from rocm_yolo.run.devices import Layout

_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|ba)$")
_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MID_EPOCH_KEY = "rocm_yolo_mid_epoch"  # rocm-yolo's key in an Ultralytics checkpoint dict
FORMAT = 1  # the layout of the dict under MID_EPOCH_KEY; a change of it is a new number


class FormatError(ValueError):
    """The record under :data:`MID_EPOCH_KEY` is not one this rocm-yolo reads (another format, or damaged)."""


@dataclass(frozen=True)
class MidEpochState:
    """Where a run stopped inside an epoch, and what continues it there."""

    epoch: int  # the epoch in progress, 0-based (the checkpoint's "epoch" is the last completed one)
    batch: int  # batches of it done
    batches: int  # batches per epoch
    samples: int  # images in the train set
    batch_size: int
    ni: int  # Ultralytics' warm-up counter at that batch
    last_opt_step: int  # the ni of the last optimizer step
    model: Mapping  # the raw model's float32 weights (resume would rebuild it from the EMA)
    grads: Mapping  # gradients accumulated since the last optimizer step, by parameter name
    tloss: Mapping | None  # the running loss
    stopper: Mapping  # the early-stopping state
    rng: Mapping  # Python, NumPy, torch and CUDA/HIP generator states
    sampler_state: Any  # what fixed the epoch's sample order: a generator state, or {"epoch": E} (DDP)
    skip: int  # indices of that order already trained
    buffer: list | None = None  # the in-process dataset's mosaic buffer (profile single)
    requested: Mapping = field(default_factory=dict)  # batch/imgsz as the run asked for them
    layout: Mapping = field(default_factory=dict)  # the run's ranks and their batch (run.devices.Layout.to_dict)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sampler_state", "skip")}
        out["sampler"] = {"state": self.sampler_state, "skip": self.skip}
        out["format"] = FORMAT
        return out

    @classmethod
    def from_dict(cls, d: object) -> "MidEpochState":
        """The record of a checkpoint's dict; :class:`FormatError` says why it cannot be read."""
        if not isinstance(d, Mapping):
            raise FormatError(f"not a mapping ({type(d).__name__})")
        if d.get("format") != FORMAT:
            raise FormatError(
                f"it was written by another rocm-yolo (position format {d.get('format')}, this one reads {FORMAT})"
            )
        sampler = d.get("sampler")
        if not isinstance(sampler, Mapping) or "skip" not in sampler:
            raise FormatError("its sample order is missing")
        names = {f.name for f in fields(cls)} - {"sampler_state", "skip"}
        missing = sorted(n for n in names if n not in d and n not in ("buffer", "requested", "layout"))
        if missing:
            raise FormatError(f"it lacks {', '.join(missing)}")
        values = {n: d[n] for n in names if n in d}
        return cls(**values, sampler_state=sampler.get("state"), skip=int(sampler["skip"]))

    @classmethod
    def of(cls, ckpt: Mapping | None) -> "MidEpochState | None":
        """The record of checkpoint dict ``ckpt``; None for an end-of-epoch checkpoint. Raises :class:`FormatError`."""
        raw = (ckpt or {}).get(MID_EPOCH_KEY)
        return None if raw is None else cls.from_dict(raw)

    def layout_of(self, train_args: Mapping) -> Layout:
        """The layout the position counts in: the record's own, else (a record written before it held one) the
        ranks its checkpoint's ``train_args`` batch made of ``batch_size`` each (several: DDP's ``{"epoch": E}``)."""
        found = Layout.from_dict(self.layout)
        if found is not None:
            return found
        if not isinstance(self.sampler_state, Mapping):
            return Layout(1, self.batch_size)
        batch = train_args.get("batch")
        world = batch // self.batch_size if isinstance(batch, int) and batch >= self.batch_size else 1
        return Layout(max(world, 1), self.batch_size)

    def describe(self, epochs: object) -> str:
        return f"epoch {self.epoch + 1}/{epochs}, batch {self.batch:,}/{self.batches:,}"

    def mismatch(self, saved_args: Mapping, given: Mapping) -> str | None:
        """Why this position means nothing with the train arguments ``given`` (batch, imgsz), or None.

        A value equal to what the run asked for (``requested``: e.g. ``batch=-1`` before AutoBatch chose
        16, ``imgsz=600`` before Ultralytics rounded it to 608) or to what it used (``saved_args``) is no
        change."""
        changed = [
            f"{key} {saved_args.get(key)!r} -> {given[key]!r}"
            for key in ("batch", "imgsz")
            if key in given and given[key] not in (saved_args.get(key), self.requested.get(key, saved_args.get(key)))
        ]
        return ", ".join(changed) or None


def has_position(ckpt: Mapping | None) -> bool:
    """Whether checkpoint dict ``ckpt`` is a mid-epoch one (holds a record, readable or not)."""
    return isinstance((ckpt or {}).get(MID_EPOCH_KEY), Mapping)


# --------------------------------------------------------------------------- how often


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
            f"{option('checkpoint_every', value)}: write a time (30s, 10m, 1.5h), a number of batches (500ba), "
            "or 0 to turn mid-epoch checkpoints off"
        )
    number, unit = m[1], m[2]
    if unit == "ba":
        return CheckpointInterval(text, batches=int(number))
    return CheckpointInterval(text, seconds=float(number) * _SECONDS[unit])
