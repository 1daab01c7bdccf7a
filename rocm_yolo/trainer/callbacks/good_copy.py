"""The verified copy of ``last.pt`` (``last_good.pt``), kept off the training thread.

After every end-of-epoch save, ``last.pt`` is read back as ``torch.load`` reads it (every record its
pickle names, the CRCs) and kept atomically as ``last_good.pt``, the checkpoint a resume falls back
to when ``last.pt`` was cut short. Where every save replaces ``last.pt`` whole (the atomic saves of
``patches/saves``: a temporary file renamed over it, never a write into it), the verified file
itself is kept, by a hard link: no byte is written. Otherwise (a save patch is off) it is copied
durably (temporary file, fsync, rename), which costs a read and a write of the checkpoint each epoch.
The check costs a read of it either way: on short epochs (small data sets, fine-tuning,
classification) too much for the training thread. So a background thread does it, and:

- the next save waits for the previous copy first (at the end of the next epoch's training, before its
  validation), so there is never a moment without a good copy; and what is verified is the copy itself;
- the last epoch's copy (``trainer.stop``: the final epoch, or early stopping) is made before the
  training goes on, as the end of training strips ``last.pt`` right after: if that rewrite is cut short,
  this copy is the epoch with its optimizer (a finished run then keeps none:
  :func:`rocm_yolo.supervisor.restart.tidy_finished`);
- the end of training (and a stop at the end of an epoch, e.g. ``time=``) waits for a copy in progress.

Listeners hear each epoch whose copy was verified (the mid-epoch checkpoints of that epoch then go).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from rocm_yolo.process.lifecycle import uninterrupted
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import weights


class GoodCopy:
    """Ultralytics callbacks that keep ``last_good.pt``; they never break training."""

    def __init__(self, log: RunLog, on_verified: tuple[Callable[[int], None], ...] = (), link: bool | None = None):
        self.log = log
        self.on_verified = on_verified
        self.copier: threading.Thread | None = None
        self.link = replaced_whole() if link is None else link  # read once the patches are installed

    def on_model_save(self, trainer) -> None:
        self.wait()
        if trainer.stop:  # the last save: the end of training strips last.pt next, this copy must be made of it now
            self._copy(Path(trainer.last), trainer.epoch)
            return
        self.copier = threading.Thread(
            target=self._copy, args=(Path(trainer.last), trainer.epoch), name="rocm-yolo-good-copy"
        )
        self.copier.start()  # not a daemon: a stop (SIGTERM) lets the copy in progress finish

    def on_train_epoch_end(self, trainer) -> None:
        self.wait()  # before this epoch's validation and save: the previous copy is made by then

    def on_fit_epoch_end(self, trainer) -> None:
        if trainer.stop:  # the training's time limit (time=) stops it after the save: the copy before the strip
            self.wait()

    def on_train_end(self, trainer) -> None:
        self.wait()

    def wait(self) -> None:
        if self.copier is not None:
            with uninterrupted():  # a stop raised in join() would leave the copy half written (python/cpython#90882)
                self.copier.join()
            self.copier = None

    def _copy(self, last: Path, epoch: int) -> None:
        try:
            good = weights.keep_good_copy(last, link=self.link)
        except OSError as e:
            self.log.info(f"could not keep a verified copy of {last}: {e}")
            return
        if good is None:
            self.log.info(f"{last} failed verification right after the save; kept the previous copy")
            return
        for listener in self.on_verified:
            try:
                listener(epoch)
            except Exception as e:  # noqa: BLE001 - housekeeping must not break training
                self.log.info(f"after verifying {last}: {type(e).__name__}: {e}")


def replaced_whole() -> bool:
    """Whether every rewrite of ``last.pt`` replaces the file (temporary file, rename) instead of writing into it:
    each epoch's save and the end of training's, both patched (:mod:`rocm_yolo.patches.saves`)."""
    from rocm_yolo.patches.saves import epoch_save, final_save

    return epoch_save.installed() and final_save.installed()
