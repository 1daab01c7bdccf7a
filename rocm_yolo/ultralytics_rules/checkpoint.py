"""Ultralytics' checkpoint dict: the keys ``save_model`` writes, and the plain fields a resume decides on.

Read without torch and without running any code a checkpoint names
(:func:`rocm_yolo.run.weights.read_inert`): ``epoch``, ``train_args`` and whether it holds a
mid-epoch position (:mod:`rocm_yolo.run.midepoch_state`); and whether a file is a checkpoint Ultralytics can train
from at all (:func:`checkpoint_problem`).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.errors import command, option
from rocm_yolo.run.midepoch_state import has_position
from rocm_yolo.run.weights import load, read_inert

# The keys of BaseTrainer.save_model's dict that rocm-yolo reads or writes itself (a mid-epoch checkpoint
# mirrors them, so YOLO(path) and Ultralytics' own resume accept it); compat checks save_model still writes them.
CHECKPOINT_KEYS = ("epoch", "ema", "optimizer", "train_args")


@dataclass(frozen=True)
class Summary:
    """The plain fields of an Ultralytics checkpoint that decide what a resume does."""

    epoch: int | None  # the last completed epoch (0-based); -1 once the optimizer was stripped (a finished run)
    epochs: int | None  # the run's train_args epochs
    mid_epoch: bool  # a rocm-yolo mid-epoch checkpoint
    train_args: dict

    @property
    def finished(self) -> bool:
        """Every epoch is trained: Ultralytics' resume would refuse it."""
        return finished(self.epoch, self.epochs, self.mid_epoch)

    @property
    def stripped(self) -> bool:
        """The end of training's rewrite (``strip_optimizer``): no optimizer, ``epoch`` -1; it cannot be resumed."""
        return not self.mid_epoch and (self.epoch is None or self.epoch < 0)

    def finished_for(self, target: int | None) -> bool:
        """Every epoch of ``target`` (a resume's ``--epochs``; None: the run's own) is trained."""
        return finished(self.epoch, max(self.epochs or 0, target or 0) or None, self.mid_epoch)


def finished(epoch, epochs, mid_epoch: bool) -> bool:
    """Whether a checkpoint with these fields belongs to a run that has trained all its epochs."""
    if mid_epoch:
        return False
    return epoch is None or epoch < 0 or bool(epochs and epoch + 1 >= epochs)


def summary(path: str | Path) -> Summary | None:
    """The :class:`Summary` of the checkpoint at ``path``; None when it cannot be read."""
    ckpt = read_inert(path)
    if not isinstance(ckpt, dict):
        return None
    args = ckpt.get("train_args") if isinstance(ckpt.get("train_args"), dict) else {}
    epoch = ckpt.get("epoch")
    epochs = args.get("epochs")
    return Summary(
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        epochs=epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None,
        mid_epoch=has_position(ckpt),
        train_args=args,
    )


# torch's legacy format (torch.save before the zip format, torch 1.6): the pickle of this magic number comes first
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
MODEL_HINT = (
    "give a .pt Ultralytics saved (e.g. runs/detect/train/weights/best.pt), or an Ultralytics model (yolo26n.pt)"
)


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is no checkpoint Ultralytics trains from (``attempt_load_one_weight`` takes its ``ema`` or
    ``model``), or None. Read as ``torch.load`` finds its parts: the zip directory at the file's end and the pickle of
    a few kilobytes it names; the tensors are never read. A file in torch's legacy format is left to Ultralytics."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(LEGACY_MAGIC))
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not head:
        return f"an empty file: {MODEL_HINT}"
    if head == LEGACY_MAGIC:
        return None
    try:
        with zipfile.ZipFile(path) as z:
            obj, _, _ = load(z)
    except zipfile.BadZipFile:
        return f"not a torch checkpoint (no zip archive, or one cut short): {MODEL_HINT}"
    except KeyError:
        return f"a zip archive, but no torch checkpoint (no data.pkl in it): {MODEL_HINT}"
    except Exception as e:  # noqa: BLE001 - a damaged pickle, an unknown compression: not a file to train from
        return f"a damaged torch checkpoint ({type(e).__name__}: {e}): {MODEL_HINT}"
    if not isinstance(obj, dict) or all(obj.get(key) is None for key in ("ema", "model")):
        return (
            "a torch file with no Ultralytics model in it (a state_dict, a TorchScript file or another library's "
            f"weights?): {MODEL_HINT}"
        )
    return None


def already_finished(run_dir: str | Path, epochs: object) -> str:
    """Why a resume of a run that trained all its epochs is refused, and what works instead."""
    return (
        f"the run in {run_dir} has already finished all {epochs} epochs: train it further with "
        f"{command(resume=run_dir, epochs='N')} (N > {epochs}), or start a new run from its weights with "
        f"{option('model', Path(run_dir) / 'weights' / 'last.pt')}"
    )


def last_epoch(csv: Path) -> int:
    """The epoch of the last row of ``results.csv`` (Ultralytics writes one per epoch trained; 1-based), 0 without
    one."""
    try:
        rows = csv.read_text().strip().splitlines()
    except OSError:
        return 0
    if len(rows) < 2:
        return 0
    header = [c.strip() for c in rows[0].split(",")]
    try:
        return int(float(rows[-1].split(",")[header.index("epoch")]))
    except (ValueError, IndexError):
        return len(rows) - 1
