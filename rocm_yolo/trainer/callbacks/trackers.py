"""One MLflow run and one W&B run for all the attempts of a rocm-yolo run (:class:`Trackers`).

Ultralytics opens its tracker run in ``on_pretrain_routine_end`` of its MLflow and W&B
callbacks (W&B's in ``on_pretrain_routine_start`` up to 8.4.158 at least), which it loads
when the library is installed and its settings enable it
(``yolo settings mlflow=True``, the default; ``wandb=True``). Left alone, every attempt
opens a new MLflow run: a watchdog restart leaves one FAILED run and one FINISHED, and the
second logs the changed ``workers`` again, which MLflow refuses, so Ultralytics stops tracking.

``on_pretrain_routine_start`` (after Ultralytics added its callbacks to the trainer) puts a
wrapper in place of each of those functions in this trainer's callback lists. During
the wrapped call, and only then, the callback's module sees its library through a proxy
that changes one or two functions:

- MLflow: ``start_run`` continues the run recorded in ``RUN/rocm_yolo/tracker.json`` (as
  ``MLFLOW_RUN_ID`` would; one the user set wins), or starts a new one when that run cannot
  be continued; ``log_params`` leaves out the parameters the run already has and logs a
  changed one as ``attemptN.KEY``;
- W&B: ``init`` continues the recorded run (``id=``, ``resume="allow"``), also after a
  restart from the start, where Ultralytics itself would start a new one.

After the call the run's ids go into ``tracker.json``, and the run is tagged with every
attempt (:mod:`.tracker_record`): cause, profile, workers, batch size, where it failed.
Ultralytics still ends the run (FINISHED at the end of training, FAILED on an error); a
killed attempt leaves it RUNNING, and the next attempt continues it.

Nothing happens when Ultralytics did not load the callback (library missing, disabled in its
settings, a rank above 0), when ``ROCM_YOLO_ONE_TRACKER_RUN=0`` (one tracker run per
attempt, as plain Ultralytics), or when compat finds the callback changed. Nothing raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import replace

from rocm_yolo import environment, errors
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.trainer.callbacks.tracker_record import (
    TrackerRecord,
    attempts,
    mlflow_tags,
    params_to_log,
    wandb_config,
    wandb_tags,
)
from rocm_yolo.ultralytics_rules import compat

MLFLOW_RUN_ID = "MLFLOW_RUN_ID"  # MLflow's own variable: a run the user chose


class Trackers:
    """Installs the wrappers of Ultralytics' tracker callbacks on the trainer (see the module's docstring)."""

    def __init__(self, spec: RunSpec, log: RunLog, enabled: bool | None = None):
        self.paths = spec.paths
        self.attempt = spec.attempt
        self.log = log
        self.enabled = enabled if enabled is not None else os.environ.get(environment.ONE_TRACKER_RUN, "1") != "0"

    def on_pretrain_routine_start(self, trainer) -> None:
        if not self.enabled:
            return
        try:
            for key, wrapper in (("mlflow", MlflowRun), ("wandb", WandbRun)):
                for hooks, index, module in _loaded(trainer, key):
                    hooks[index] = wrapper(self, module, hooks[index])
        except Exception as e:  # noqa: BLE001 - a tracker never stops training
            self.log.info(f"tracker runs: could not join the attempts of this run ({errors.one_line(e)})")

    # shared by the wrappers ------------------------------------------------------------------
    def record(self) -> TrackerRecord:
        return TrackerRecord.read(self.paths.tracker)

    def remember(self, **ids) -> None:
        try:
            replace(self.record(), **ids).write(self.paths.tracker)
        except OSError as e:
            self.log.info(f"tracker runs: could not write {self.paths.tracker} ({e}): the next attempt opens a new run")

    def history(self):
        return attempts(self.paths, self.attempt)


def _loaded(trainer, key: str) -> list:
    """Where Ultralytics' tracker callback ``key`` may open its run in this trainer: (the event's list of callbacks,
    the index of the callback's function in it, its module), for each event of ``compat.TRACKER_EVENTS`` it has;
    when Ultralytics did not load it (not installed, off in its settings, a rank above 0) or compat finds it
    changed: none. A function already wrapped is not found again."""
    module = sys.modules.get(compat.TRACKER_CALLBACKS[key][0])
    found = []
    for event in compat.TRACKER_EVENTS:
        original = getattr(module, event, None)
        hooks = trainer.callbacks.get(event, [])
        if original is not None and original in hooks:
            found.append((hooks, hooks.index(original), module))
    return found if found and not compat.missing((compat.TRACKER_REQUIREMENTS[key],)) else []


@contextlib.contextmanager
def _seen_as(module, name: str, proxy):
    """``module``'s global ``name`` is ``proxy`` inside the block, and what it was after it."""
    real = module.__dict__[name]
    module.__dict__[name] = proxy
    try:
        yield real
    finally:
        module.__dict__[name] = real


class _Proxy:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


class _MlflowSeen(_Proxy):
    """``mlflow`` as Ultralytics' callback sees it while it opens its run."""

    def __init__(self, real, record: TrackerRecord, attempt: int, log: RunLog):
        super().__init__(real)
        self._record, self._attempt, self._log = record, attempt, log

    def _ours(self) -> str | None:
        """The run to continue: the recorded one, if it lives at this tracking URI and the user named none."""
        record = self._record
        try:
            here = str(self._real.get_tracking_uri())
        except Exception:  # noqa: BLE001
            return None
        return None if os.environ.get(MLFLOW_RUN_ID) or record.mlflow_uri != here else record.mlflow_run_id

    def start_run(self, *args, **kwargs):
        run_id = None if args or "run_id" in kwargs else self._ours()
        if run_id:
            try:
                return self._real.start_run(run_id=run_id, **{k: v for k, v in kwargs.items() if k != "run_name"})
            except Exception as e:  # noqa: BLE001 - deleted, another experiment, ...
                self._log.info(f"MLflow run {run_id} cannot be continued ({errors.one_line(e)}): a new run")
        return self._real.start_run(*args, **kwargs)

    def log_params(self, params, *args, **kwargs):
        active = self._real.active_run()
        have = dict(active.data.params) if active is not None else {}
        return self._real.log_params(params_to_log(have, dict(params), self._attempt), *args, **kwargs)


class MlflowRun:
    """Ultralytics' MLflow callback that opens its run, continuing the run's MLflow run."""

    def __init__(self, owner: Trackers, module, original):
        self.owner, self.module, self.original = owner, module, original

    def __call__(self, trainer) -> None:
        try:
            real = self.module.mlflow
            proxy = _MlflowSeen(real, self.owner.record(), self.owner.attempt, self.owner.log)
        except Exception:  # noqa: BLE001 - as Ultralytics would, then
            return self.original(trainer)
        with _seen_as(self.module, "mlflow", proxy):
            self.original(trainer)
        if not getattr(trainer, compat.MLFLOW_ACTIVE, False):
            return  # Ultralytics is not tracking this run (tests, a failed start): nothing to record
        try:
            active = real.active_run()
            self.owner.remember(mlflow_run_id=active.info.run_id, mlflow_uri=str(real.get_tracking_uri()))
            real.set_tags(mlflow_tags(self.owner.history()))
        except Exception as e:  # noqa: BLE001
            self.owner.log.info(f"MLflow: could not record this attempt on the run ({errors.one_line(e)})")


class _WandbSeen(_Proxy):
    """``wandb`` as Ultralytics' callback sees it while it opens its run."""

    def __init__(self, real, run_id: str | None):
        super().__init__(real)
        self._run_id = run_id

    def init(self, *args, **kwargs):
        if self._run_id:
            kwargs.update(id=self._run_id, resume="allow")
        return self._real.init(*args, **kwargs)


class WandbRun:
    """Ultralytics' W&B callback that opens its run, continuing the run's W&B run."""

    def __init__(self, owner: Trackers, module, original):
        self.owner, self.module, self.original = owner, module, original

    def __call__(self, trainer) -> None:
        try:
            real = self.module.wb
            proxy = _WandbSeen(real, self.owner.record().wandb_id)
        except Exception:  # noqa: BLE001 - as Ultralytics would, then
            return self.original(trainer)
        with _seen_as(self.module, "wb", proxy):
            self.original(trainer)
        run = getattr(real, "run", None)
        if run is None:
            return
        try:
            self.owner.remember(wandb_id=run.id)
            history = self.owner.history()
            run.tags = wandb_tags(run.tags, history)
            run.config.update(wandb_config(history), allow_val_change=True)
        except Exception as e:  # noqa: BLE001
            self.owner.log.info(f"W&B: could not record this attempt on the run ({errors.one_line(e)})")
