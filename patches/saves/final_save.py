"""The end of training, written atomically: Ultralytics' ``final_eval`` rewrites last.pt and best.pt in place.

After the last epoch, ``BaseTrainer.final_eval`` calls ``strip_optimizer(last)`` and
``strip_optimizer(best)``, which ``torch.save`` the stripped checkpoint over the file. A stop
in the middle (``torch.save`` calls back into Python for every tensor, so a SIGTERM's handler
runs inside it; a SIGKILL anywhere) left a truncated ``last.pt`` or ``best.pt``, or a
well-formed archive lacking some tensor records, with no copy of ``best.pt`` anywhere.

The patch is one module global, ``ultralytics.engine.trainer.strip_optimizer`` (the name
``final_eval`` calls): the same function, saving into a temporary file beside the target,
fsynced and renamed over it. A stop leaves the old file or the new one, both loadable. ``last.pt``
keeps three numbers the strip would drop (:func:`kept_for_training_on`: the best fitness, the
early-stopping state, the EMA's update count), from which ``--resume RUN --epochs N`` trains the
finished run on; its optimizer goes, as Ultralytics strips it.
:func:`install` is idempotent; :func:`uninstall` puts the original back.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path

from rocm_yolo.patches.swap import Swaps
from rocm_yolo.process.lifecycle import uninterrupted
from rocm_yolo.run import hooks
from rocm_yolo.run.atomic import create_temporary, replace_durably, temporary
from rocm_yolo.run.paths import RunPaths

_swaps = Swaps()  # ultralytics.engine.trainer's global strip_optimizer


def install(run_dir: str | os.PathLike) -> None:
    import ultralytics.engine.trainer as module

    _swaps.replace(module, "strip_optimizer", lambda current: _atomic_strip(current, RunPaths(run_dir)))


def _atomic_strip(current, paths: RunPaths):
    @functools.wraps(current)
    def strip_optimizer(f="best.pt", s="", updates=None):
        target = Path(s or f)
        tmp = temporary(target)
        if Path(f) == paths.last:  # what training the run on needs besides the weights (a few numbers)
            updates = {**kept_for_training_on(f), **(updates or {})}
        try:
            os.close(create_temporary(tmp))  # made anew (a link planted under its name goes), then torch.save fills it
            with uninterrupted():  # a stop during the rewrite waits for it
                with hooks.final_save(target.name, paths), _log_names(tmp, target, named=bool(s)):
                    result = current(f, s=str(tmp), updates=updates)
                if tmp.stat().st_size:  # not when f was no Ultralytics checkpoint: nothing was written
                    replace_durably(tmp, target)
                else:
                    tmp.unlink()
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return result

    return strip_optimizer


KEPT = ("best_fitness", "stopper", "updates")  # of the keys strip_optimizer sets to None: a few numbers


def kept_for_training_on(f) -> dict:
    """Of ``last.pt``'s keys the strip sets to None, those ``--resume RUN --epochs N`` trains the run on with: the best
    fitness (so that ``best.pt`` is replaced only by a better epoch), the early-stopping state and the EMA's update
    count. The optimizer goes, as Ultralytics strips it. {} where they cannot be read (the strip says why)."""
    try:
        import torch

        ckpt = torch.load(f, map_location="cpu", weights_only=False)  # Ultralytics' own file, as it loads it
    except Exception:  # noqa: BLE001 - the strip itself reads the file next and says what is wrong with it
        return {}
    if not isinstance(ckpt, dict):
        return {}
    out = {}
    for key in KEPT:
        value = ckpt.get(key)
        if key == "stopper" and isinstance(value, dict):
            out[key] = {k: float(v) if hasattr(v, "item") else v for k, v in value.items()}
        elif value is not None and hasattr(value, "__float__"):
            out[key] = int(value) if key == "updates" else float(value)
    return out


@contextlib.contextmanager
def _log_names(tmp: Path, target: Path, named: bool):
    """Ultralytics' "Optimizer stripped from F, saved as S" line names the file the user sees, not ``tmp``."""

    def rename(record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and str(tmp) in record.msg:
            msg = record.msg if named else record.msg.replace(f" saved as {tmp},", "")
            record.msg = msg.replace(str(tmp), str(target))
        return True

    logger = logging.getLogger("ultralytics")
    logger.addFilter(rename)
    try:
        yield
    finally:
        logger.removeFilter(rename)


def uninstall() -> None:
    _swaps.restore()


def installed() -> bool:
    return _swaps.installed()
