"""The run's settings held on Ultralytics' trainer and its loaders: ordinary Ultralytics callbacks
(:class:`TrainerSettings`).

- ``on_pretrain_routine_start`` sees the trainer right after ``BaseTrainer.__init__`` set
  ``args.workers = 0`` for CPU/MPS: it restores the requested count (saying so), enforces the
  profile's ``val`` and the presets (e.g. ``amp``) also on resume, where Ultralytics' resume
  whitelist would drop them, and tags the trainer's loaders as "train" or "val" so the
  DataLoader patch can cap and describe them.
- ``on_train_epoch_start`` gives a non-persistent profile fresh workers every epoch:
  Ultralytics' ``InfiniteDataLoader`` keeps one iterator for the whole run, so
  ``persistent_workers=False`` alone changes nothing; ``reset()`` closes the old workers and
  the next epoch's first batch starts new ones.
"""

from __future__ import annotations

import functools
import os

from rocm_yolo.patches.loaders import dataloader as loader_patch
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.spec import RunSpec


class TrainerSettings:
    """Keeps the run's settings in force where Ultralytics would change or drop them: workers, ``val``, the presets,
    the epochs of an extended resume; tags each loader's role, and gives a non-persistent profile fresh workers."""

    def __init__(self, spec: RunSpec, log: RunLog, arg_presets: dict | None = None):
        self.spec = spec
        self.log = log
        self.arg_presets = dict(arg_presets or {})
        self.training_started = False
        self.epoch_started = False
        self.recorded_epoch: int | None = None

    # setup ---------------------------------------------------------------------------------
    def on_pretrain_routine_start(self, trainer) -> None:
        args = trainer.args
        want = self.spec.loader.workers
        if args.workers != want:
            self.log.info(
                f"Ultralytics set workers={args.workers} for device '{args.device or 'auto'}'; "
                f"restored the requested workers={want}"
            )
            args.workers = want
        args.val = self.spec.val
        for key, value in self.arg_presets.items():
            setattr(args, key, value)
        epochs = self.spec.extended_epochs
        if epochs is not None and epochs != args.epochs:  # --resume RUN --epochs N: Ultralytics' resume kept its own
            args.epochs = trainer.epochs = epochs  # before the scheduler is built: its schedule follows N
            _save_args(trainer)
        original = trainer.get_dataloader

        @functools.wraps(original)
        def get_dataloader(*args, **kwargs):  # any signature: only the role is read
            mode = kwargs.get("mode", args[3] if len(args) > 3 else "train")
            with loader_patch.loader_role(mode):
                return original(*args, **kwargs)

        trainer.get_dataloader = get_dataloader

    def on_pretrain_routine_end(self, trainer) -> None:
        for entry in loader_patch.built_loaders():
            self.log.info(loader_patch.describe(entry))
            if entry["role"] == "train":
                fewer = fewer_workers(entry["requested_workers"], self.spec.loader.workers, trainer)
                if fewer:
                    self.log.info(fewer)
        self.log.event("loaders", loaders=loader_patch.built_loaders())

    def on_train_start(self, trainer) -> None:
        self.training_started = True

    # epochs --------------------------------------------------------------------------------
    def _fresh_workers(self, loader) -> None:
        """Under a non-persistent profile, close ``loader``'s workers: its next batch starts new ones."""
        if self.spec.loader.persistent_workers or self.spec.loader.workers == 0:
            return
        if getattr(loader, "iterator", None) is not None and hasattr(loader, "reset"):
            loader.reset()

    def on_train_epoch_start(self, trainer) -> None:
        if self.epoch_started:  # the first epoch of this process already has fresh workers
            self._fresh_workers(trainer.train_loader)
        self.epoch_started = True

    def on_train_batch_end(self, trainer) -> None:
        if self.recorded_epoch == trainer.epoch:
            return
        self.recorded_epoch = trainer.epoch
        workers = getattr(getattr(trainer.train_loader, "iterator", None), "_workers", None) or []
        self.log.event("workers", epoch=trainer.epoch + 1, loader="train", pids=[w.pid for w in workers])

    def on_val_start(self, validator) -> None:
        self._fresh_workers(getattr(validator, "dataloader", None))


def fewer_workers(given: int, want: int, trainer) -> str | None:
    """Why Ultralytics' ``build_dataloader`` gave the train loader fewer workers than the run's ``want``: it
    caps them at the CPUs per GPU and at the loader's batches (a loader of one batch gets none)."""
    if given >= want:
        return None
    try:
        batches = len(trainer.train_loader)
    except TypeError:
        batches = None
    why = []
    if batches is not None and batches <= 1:
        why.append("the training set makes 1 batch per epoch, and it then loads in the trainer itself")
    elif batches is not None and batches < want:
        why.append(f"the training set makes {batches} batches per epoch, and it starts no more workers than that")
    gpus = _gpus(trainer)
    if gpus > 1 and (os.cpu_count() or 1) // gpus < want:
        why.append(f"it starts at most {os.cpu_count()} CPUs // {gpus} GPUs workers per GPU")
    reason = "; ".join(why) or "its own caps"
    return f"Ultralytics' build_dataloader gave the train loader workers={given} of the requested {want}: {reason}"


def _gpus(trainer) -> int:
    device = getattr(trainer, "device", None)
    if getattr(device, "type", "cpu") in ("cpu", "mps"):
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - only a reason in a log line
        return 0


def _save_args(trainer) -> None:
    """Ultralytics' args.yaml again, as it writes it in ``BaseTrainer.__init__``, now that the arguments changed."""
    try:
        from ultralytics.utils import YAML

        YAML.save(trainer.save_dir / "args.yaml", vars(trainer.args))
    except Exception:  # noqa: BLE001 - a record for the user; training does not depend on it
        pass
