"""Ultralytics' checkpoint dict: the keys ``save_model`` writes, and the plain fields a resume decides on.

Read without torch and without running any code a checkpoint names
(:func:`rocm_yolo.run.checkpoints.read_inert`): ``epoch``, ``train_args`` and whether it holds a
mid-epoch position (:mod:`rocm_yolo.run.midepoch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from shlex import quote

from rocm_yolo.run.checkpoints import read_inert
from rocm_yolo.run.midepoch import has_position

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


def already_finished(run_dir: str | Path, epochs: object) -> str:
    """Why a resume of a run that trained all its epochs is refused, and what works instead."""
    return (
        f"the run in {run_dir} has already finished all {epochs} epochs: train it further with "
        f"--resume {quote(str(run_dir))} --epochs N (N > {epochs}), or start a new run from its weights with "
        f"--model {quote(str(Path(run_dir) / 'weights' / 'last.pt'))}"
    )
