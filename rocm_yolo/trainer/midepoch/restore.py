"""Continuing a run from a mid-epoch checkpoint at the next batch, as if it had never stopped.

``resume_training`` (wrapped on the trainer instance) restores the optimizer, scaler, EMA,
raw weights and stopper (for the first epoch, where Ultralytics' resume cannot start, it does
it all); at the resumed epoch's start the callbacks set the loop's ``last_opt_step`` and
accumulated gradients, make the loop's ``i`` start at the next batch
(:mod:`rocm_yolo.patches.saves.loop_position`) and the sampler replay the epoch's order without the
batches done (:mod:`.sample_order`); the RNG states are restored when that pass starts, the
running loss at the first batch. Listeners (the heartbeat, the checkpoint writer, the fault
injector) hear the batch the epoch continues after. Before any of that, :func:`checked_resume`
decides whether the checkpoint can continue inside its epoch here at all (its format, the batch
and image size given, this Ultralytics), or the run resumes from the end of its last epoch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from rocm_yolo.errors import UsageError
from rocm_yolo.patches.saves import loop_position
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import devices, weights
from rocm_yolo.run.devices import Layout
from rocm_yolo.run.midepoch_state import FormatError, MidEpochState
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.trainer.midepoch import sample_order
from rocm_yolo.trainer.midepoch.capture import loads_in_process, set_rng_states, unwrap
from rocm_yolo.trainer.midepoch.sample_order import TrainOrder
from rocm_yolo.ultralytics_rules import compat


def load_training_state(trainer, ckpt: dict) -> None:
    """What Ultralytics' resume loads (optimizer, scaler, EMA, best fitness, stopper), for the first epoch."""
    optimizer = ckpt["optimizer"]
    for saved, group in zip(optimizer["param_groups"], trainer.optimizer.param_groups):
        if "fused" in group:
            saved["fused"] = group["fused"]
    trainer.optimizer.load_state_dict(optimizer)
    if ckpt.get("scaler"):
        trainer.scaler.load_state_dict(ckpt["scaler"])
    trainer.ema.ema.load_state_dict(ckpt["ema"].float().state_dict())
    trainer.ema.updates = ckpt["updates"]
    trainer.best_fitness = ckpt.get("best_fitness")


def refill_buffer(dataset, buffer: list) -> None:
    """Load the mosaic buffer's images in order: the in-process dataset's buffer and cache as they were."""
    for index in buffer:
        if 0 <= index < len(dataset) and dataset.ims[index] is None:
            dataset.load_image(index)


class MidEpochResume:
    """Ultralytics callbacks that continue a run inside the epoch of its mid-epoch checkpoint."""

    def __init__(
        self,
        log: RunLog,
        order: TrainOrder,
        *,
        on_resumed: tuple[Callable[[int], None], ...] = (),
        supported: Callable[[], bool] = lambda: True,
    ):
        self.log = log
        self.order = order
        self.on_resumed = on_resumed
        self.supported = supported  # whether this Ultralytics has every internal it needs (ultralytics_rules.compat)
        self.state: MidEpochState | None = None  # the position of the checkpoint this process continues
        self.saved_layout: Layout | None = None  # the layout its position counts in
        self.name = ""
        self.loader = None  # the train loader the position was checked against
        self.continuing: MidEpochState | None = None  # between the resumed epoch's start and its first batch
        self.rest: int | None = None  # under a new global batch: the steps of the epoch's rest, laid anew

    def on_pretrain_routine_start(self, trainer) -> None:
        if not self.supported():  # compat.check() has said so at start-up
            self.order.off(None)
            return
        loop_position.install()
        original = trainer.resume_training

        def resume_training(ckpt):
            state = MidEpochState.of(ckpt) if trainer.resume else None  # checked as it was loaded (train_args)
            if state is None:
                return original(ckpt)
            if state.epoch >= 1:
                original(ckpt)  # its "epoch" is the last completed one: Ultralytics starts the epoch in progress
            else:
                load_training_state(trainer, ckpt)  # the first epoch: Ultralytics' resume cannot start it
            self._restore_weights(trainer, ckpt, state)

        trainer.resume_training = resume_training

    def _restore_weights(self, trainer, ckpt: dict, state: MidEpochState) -> None:
        unwrap(trainer.model).load_state_dict(state.model)  # resume rebuilt the model from the EMA
        # its state, not its settings: Ultralytics lets a resume change patience
        trainer.stopper.__dict__.update({k: v for k, v in state.stopper.items() if k != "patience"})
        metrics = dict(ckpt.get("train_metrics") or {})
        trainer.fitness = metrics.pop("fitness", None)
        if metrics and trainer.metrics is not None:
            trainer.metrics.update(metrics)
        self.state = dataclasses.replace(state, model={})  # the weights are in the model now
        self.saved_layout = state.layout_of(ckpt.get("train_args") or {})
        self.name = Path(str(trainer.args.resume)).name

    def on_pretrain_routine_end(self, trainer) -> None:
        loader = trainer.train_loader
        self.order.seed = int(getattr(trainer.args, "seed", 0) or 0)
        state, relaid = self.state, self.order.relaid
        new_batch = state is not None and relaid is not None and self.saved_layout != relaid.layout
        if new_batch:
            self.order.lay_anew(relaid)  # the epoch's rest laid over the new global batch
        if not self.order.follow(loader) or state is None:
            return
        restore = (lambda: set_rng_states(state.rng)) if not devices.rank() else None
        if new_batch:
            self._continue_rest(loader, state, restore)
            return
        found = (len(loader), len(loader.dataset), sample_order.batch_size(loader))
        saved = (state.batches, state.samples, state.batch_size)
        # one GPU draws each pass from a generator, several from DistributedSampler's epoch: no replay across
        ranks_changed = isinstance(state.sampler_state, dict) != self.order.sampler.distributed
        if found != saved or ranks_changed:
            what = "the number of GPUs" if ranks_changed and found == saved else "the data set or batch"
            self.log.event(
                "resume_position",
                f"{what} changed ({saved[1]} images in {saved[0]} batches "
                f"of {saved[2]} -> {found[1]} in {found[0]} of {found[2]}): training epoch "
                f"{state.epoch + 1} from its first batch",
                found=found,
                saved=saved,
            )
            self.state = None
            return
        self.loader = loader
        # the RNG states are rank 0's: the other ranks of a multi-GPU run keep their own seeds
        self.order.sampler.resume_next_pass(state.sampler_state, state.skip, on_start=restore)
        if state.buffer and loads_in_process(loader):
            refill_buffer(loader.dataset, state.buffer)

    def _continue_rest(self, loader, state: MidEpochState, restore) -> None:
        """A new global batch on purpose: the images the epoch has left (after the checkpoint's steps of the old
        layout) are the rest of it, in batches of the new one."""
        old, new = self.saved_layout, self.order.relaid.layout
        if len(loader.dataset) != state.samples:
            self.log.event(
                "resume_position",
                f"the data set changed ({state.samples} -> {len(loader.dataset)} images): training epoch "
                f"{state.epoch + 1} from its first batch",
            )
            self.state = None
            return
        self.loader = loader
        self.rest = self.order.sampler.resume_rest(state.sampler_state, old, state.batch, on_start=restore)
        self.log.event(
            "resume_rest",
            f"a new global batch ({old.batch} -> {new.batch} images a step): the "
            f"{state.samples - min(old.batch * state.batch, state.samples)} images epoch {state.epoch + 1} has left, "
            f"in {self.rest} steps of the new batch",
            batch_from=old.batch,
            batch_to=new.batch,
            done=state.batch,  # the steps of the old batch the checkpoint had done
            steps=self.rest,
        )

    def on_train_epoch_start(self, trainer) -> None:
        state, self.state = self.state, None
        if state is None or not self.order.supported or trainer.train_loader is not self.loader:
            return  # nothing to continue, or the loader was rebuilt (Ultralytics halves the batch after an OOM)
        if trainer.epoch != state.epoch:
            self.log.event(
                "resume_position",
                f"Ultralytics started epoch {trainer.epoch + 1}, not the checkpoint's "
                f"{state.epoch + 1}: training it from its first batch",
            )
            return
        b, nb, last_opt_step = state.batch, state.batches, state.last_opt_step
        if self.rest is not None:  # the rest in the new batch's steps, ending where its epoch ends; what the
            nb = len(trainer.train_loader)  # gradients hold stays as many steps short of an optimizer step
            b = max(nb - self.rest, 0)
            last_opt_step = b + nb * state.epoch - 1 - (state.ni - state.last_opt_step)
        try:
            loop_position.set_local(loop_position.loop_frame(trainer), "last_opt_step", last_opt_step)
        except Exception as e:  # noqa: BLE001 - a changed loop: retrain the epoch's first batches instead
            self.order.off(
                f"cannot continue the training loop inside the epoch ({type(e).__name__}: {e}); "
                f"training epoch {state.epoch + 1} from its first batch"
            )
            return
        params = dict(unwrap(trainer.model).named_parameters())
        for name, grad in state.grads.items():
            params[name].grad = grad.to(params[name].device)
        loop_position.arm(trainer.train_loader, b, nb - b)
        self.continuing = dataclasses.replace(state, batch=b, batches=nb)
        for listener in self.on_resumed:
            listener(b)
        self.log.event(
            "resumed",
            f"resumed at {state.describe(trainer.epochs)} from {self.name}; continuing with batch {b + 1:,}"
            + (f" of {nb:,}" if self.rest is not None else ""),
            epoch=state.epoch + 1,
            batch=b,
            batches=nb,
            checkpoint=self.name,
        )
        self.rest = None

    def on_train_batch_start(self, trainer) -> None:
        if self.continuing is None:
            return
        state, self.continuing = self.continuing, None
        loop_position.disarm()
        if not self.order.supported:
            return
        i = loop_position.read_locals(loop_position.loop_frame(trainer), ("i",)).get("i")
        if i != state.batch:
            self.order.off(f"the training loop started at batch {i}, not {state.batch}")
            return
        device = next(unwrap(trainer.model).parameters()).device
        trainer.tloss = {k: v.to(device) for k, v in state.tloss.items()} if state.tloss else None

    def on_train_end(self, trainer) -> None:
        loop_position.uninstall()


def checked_resume(spec: RunSpec, model, log: RunLog, load) -> tuple[RunSpec, object]:
    """Check that the mid-epoch checkpoint ``spec`` resumes can continue inside its epoch here; if not (another
    batch or imgsz, or an Ultralytics without the internals it needs), resume from the end of the last epoch."""
    # a new batch given with the run's layout known keeps the position: the epoch's rest is laid over it
    keys = ("imgsz",) if spec.run_layout is not None else ("batch", "imgsz")
    given = {k: spec.train_args[k] for k in keys if k in spec.user_keys and k in spec.train_args}
    try:
        state = MidEpochState.of(model.ckpt)
        why = state.mismatch((model.ckpt or {}).get("train_args") or {}, given) if state is not None else None
    except FormatError as e:
        state, why = None, str(e)
    if why is None and state is not None and compat.missing_for(compat.MID_EPOCH_FEATURE):
        why = "this Ultralytics cannot be continued inside an epoch"
    if why is None:
        return spec, model
    name = Path(spec.resume).name
    try:
        path, note = weights.choose_resume(spec.paths.last)
    except UsageError:
        raise UsageError(
            f"{why}: the mid-epoch checkpoint {name} cannot continue with that, and the run has no "
            "end-of-epoch checkpoint yet: resume with the run's batch and imgsz, or start a new run"
        ) from None
    if note:
        log.info(note)
    log.event(
        "resume_epoch_boundary",
        f"{why}: the position in {name} means nothing with that, so the run resumes "
        f"from the end of its last epoch ({path.name})",
        reason=why,
        checkpoint=str(path),
    )
    return spec.with_changes(resume=str(path)), load(str(path))
