"""Each epoch's save, written atomically: Ultralytics' ``save_model`` truncates ``last.pt`` in place.

``BaseTrainer.save_model`` serializes the checkpoint into memory, then writes ``last.pt`` (and
``best.pt``, and ``epochN.pt`` with ``save_period``) with ``Path.write_bytes``, which opens the file
truncated: a stop between the open and the write (a SIGTERM to the run while ``last.pt`` changed;
3 of 3 tries in issue 27) left an empty ``last.pt``. The patch is one class attribute,
``BaseTrainer.save_model``: the same method, run with the trainer's ``last``, ``best`` and ``wdir``
as :class:`AtomicPath`\\ s, whose ``write_bytes`` writes a temporary file beside the target, fsyncs
it and renames it over the target (:func:`rocm_yolo.run.atomic.write_atomic`). And the whole save is
one :func:`rocm_yolo.process.lifecycle.uninterrupted` block: a stop that arrives during it waits
for the save to end. :func:`install` is idempotent; :func:`uninstall` puts the original back.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from rocm_yolo.patches.swap import Swaps
from rocm_yolo.process.lifecycle import uninterrupted
from rocm_yolo.run import hooks
from rocm_yolo.run.atomic import write_atomic

_swaps = Swaps()  # BaseTrainer.save_model


class AtomicPath(type(Path())):
    """A path whose ``write_bytes`` replaces the file whole (temporary file, fsync, rename); ``/`` keeps the class."""

    def write_bytes(self, data) -> int:
        writer = hooks.epoch_save_writer(self)  # tests: a stop halfway through the write
        write_atomic(self, (lambda f: writer(f, bytes(data))) if writer else bytes(data), durable=True)
        return len(data)


def install() -> None:
    from ultralytics.engine.trainer import BaseTrainer

    _swaps.replace(BaseTrainer, "save_model", _atomic_save)


def _atomic_save(current):
    @functools.wraps(current)
    def save_model(self, *args, **kwargs):
        kept = self.last, self.best, self.wdir
        self.last, self.best, self.wdir = (AtomicPath(os.fspath(p)) for p in kept)
        try:
            with uninterrupted():  # a stop during the save waits for it
                return current(self, *args, **kwargs)
        finally:
            self.last, self.best, self.wdir = kept

    return save_model


def uninstall() -> None:
    _swaps.restore()


def installed() -> bool:
    return _swaps.installed()
