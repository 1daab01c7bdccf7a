"""Continuing Ultralytics' training loop inside an epoch: the loop's position, read and set.

``BaseTrainer._do_train`` keeps its position in locals: ``i`` from
``enumerate(self.train_loader)``, ``ni = i + nb * epoch`` (the warm-up counter) and
``last_opt_step`` (the optimizer steps when ``ni - last_opt_step >= self.accumulate``). A
callback sees only the trainer, and warm-up recomputes ``self.accumulate`` from ``ni`` before
that comparison, so no attribute can stand in for them. Two narrow points do:

- **the batch index**: :func:`install` gives ``ultralytics.engine.trainer`` a module-global
  ``enumerate`` (a module global shadows the builtin for that module's code only). It is the
  builtin for every call except ``enumerate(loader)`` of the one loader :func:`arm` names,
  which gets ``enumerate(islice(loader, count), start=start)``: the loop's own ``i``, ``ni``
  and running-loss arithmetic then continue at batch ``start``. ``_do_train`` calls
  ``enumerate(self.train_loader)`` twice per epoch (one result is discarded unstarted; the
  loader's ``__iter__`` is a generator, so that costs nothing), so the offset stays armed
  until :func:`disarm`, at the first batch. A loader :func:`group` names yields its steps as
  :class:`MicroBatches` (a GPU that stands in for several of the run's ranks trains one for each).
- **other locals**: :func:`loop_frame` finds the running ``_do_train`` frame by walking up
  from a callback; :func:`set_local` writes one of its locals (``frame.f_locals`` is a
  write-through proxy from Python 3.13 on; before that the snapshot is written back with
  ``PyFrame_LocalsToFast``) and reads it back to check.

:func:`install` is idempotent and :func:`uninstall` removes the global again.
"""

from __future__ import annotations

import builtins
import ctypes
import itertools
import sys
from types import FrameType

from rocm_yolo.patches.swap import Swaps
from rocm_yolo.ultralytics_rules.loop_locals import LOOP_FUNCTION, LOOP_LOCALS

_swaps = Swaps()  # ultralytics.engine.trainer's global enumerate
_armed: tuple | None = None  # (loader, start, count)
_grouped: tuple | None = None  # (loader, micro-batches a step)


class MicroBatches(dict):
    """One step of a GPU that trains several micro-batches a step: as a dict, the first (the batch the loop sees:
    its loss, its log line), and ``rest``, the others, which the model's forward trains before it
    (:class:`rocm_yolo.trainer.midepoch.relayout.Relaid`)."""

    def __init__(self, parts: list):
        super().__init__(parts[0])
        self.rest = parts[1:]

    def files(self) -> list:
        """The image files of every micro-batch of the step."""
        return [f for part in (self, *self.rest) for f in part.get("im_file", ())]


def _steps(loader, size: int):
    """``loader``'s epoch (``len(loader)`` steps) as :class:`MicroBatches` of ``size`` consecutive batches: the
    loader's own epochs, ``size`` of them, drawn from one iterator (Ultralytics' ``InfiniteDataLoader``)."""
    batches = itertools.chain.from_iterable(iter(loader) for _ in range(size))
    for _ in range(len(loader)):
        yield MicroBatches([next(batches) for _ in range(size)])


def _enumerate(iterable, start=0):
    armed, grouped = _armed, _grouped
    source = iterable
    if grouped is not None and iterable is grouped[0] and start == 0:
        source = _steps(iterable, grouped[1])
    if armed is not None and iterable is armed[0] and start == 0:
        return builtins.enumerate(itertools.islice(source, armed[2]), start=armed[1])
    return builtins.enumerate(source, start)


def install() -> None:
    import ultralytics.engine.trainer as module

    _swaps.replace(module, "enumerate", lambda builtin: _enumerate)  # the module has none of its own: the builtin


def uninstall() -> None:
    global _armed, _grouped
    _swaps.restore()
    _armed = _grouped = None


def installed() -> bool:
    return _swaps.installed()


def arm(loader, start: int, count: int) -> None:
    """The next ``enumerate(loader)`` calls in the trainer module yield ``count`` batches numbered from ``start``."""
    global _armed
    _armed = (loader, start, count)


def group(loader, size: int) -> None:
    """Every ``enumerate(loader)`` in the trainer module yields steps of ``size`` batches (:class:`MicroBatches`);
    ``size`` 1 (or no loader): batches, as the loader gives them."""
    global _grouped
    _grouped = (loader, size) if loader is not None and size > 1 else None


def disarm() -> None:
    global _armed
    _armed = None


def armed() -> bool:
    return _armed is not None


def loop_frame(trainer) -> FrameType | None:
    """The ``_do_train`` frame running ``trainer``, found from a callback it called; None outside it."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == LOOP_FUNCTION and frame.f_locals.get("self") is trainer:
            return frame
        frame = frame.f_back
    return None


def read_locals(frame: FrameType, names=LOOP_LOCALS) -> dict:
    """The values of ``names`` in ``frame`` (missing ones left out), without keeping the others alive."""
    snapshot = frame.f_locals
    values = {name: snapshot[name] for name in names if name in snapshot}
    if sys.version_info < (3, 13):
        snapshot.clear()  # a cache of the frame's locals (e.g. the batch): do not hold them past this call
    return values


def set_local(frame: FrameType, name: str, value) -> None:
    """Set local ``name`` of a running ``frame``; RuntimeError if it did not take."""
    if sys.version_info >= (3, 13):
        frame.f_locals[name] = value  # PEP 667: a write-through proxy
    else:
        snapshot = frame.f_locals
        snapshot[name] = value
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))
    if read_locals(frame, (name,)).get(name) != value:
        raise RuntimeError(f"could not set {name} in {frame.f_code.co_name}")
