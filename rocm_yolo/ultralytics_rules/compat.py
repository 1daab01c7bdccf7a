"""Every Ultralytics internal rocm-yolo relies on, checked when the child starts.

rocm-yolo patches and hooks Ultralytics at narrow points. A point that moves in a new release
would otherwise break a feature silently, so each one is listed here with the rocm-yolo
feature that needs it, and checked in the training child right after the imports (with the
torch internals each patch lists beside itself: ``REQUIREMENTS`` of :mod:`rocm_yolo.patches.loaders.dataloader`,
:mod:`rocm_yolo.patches.loaders.threads` and :mod:`rocm_yolo.conv.patch`):

- an **essential** one missing is a setup error (exit 4) naming the Ultralytics or torch
  version and the feature: training would be unsafe or impossible without it;
- a **degradable** one missing is a warning saying which rocm-yolo feature is off.

The range of Ultralytics releases tested is :data:`rocm_yolo.ultralytics_rules.versions.SUPPORTED_ULTRALYTICS`.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import inspect
import re
import sys
from dataclasses import dataclass
from typing import Callable

from rocm_yolo.errors import SetupError
from rocm_yolo.ultralytics_rules.checkpoint import CHECKPOINT_KEYS
from rocm_yolo.ultralytics_rules.loop_locals import LOOP_LOCALS, LOOP_SOURCE
from rocm_yolo.ultralytics_rules.versions import SUPPORTED_ULTRALYTICS, untested, untested_torch

MID_EPOCH_FEATURE = "mid-epoch checkpoints (--checkpoint-every) and resuming inside an epoch"
FINAL_SAVE_FEATURE = "the end of training's rewrite of last.pt and best.pt, written atomically"
EPOCH_SAVE_FEATURE = "each epoch's save of last.pt and best.pt, written atomically (a stop never empties last.pt)"
# Ultralytics' tracker callbacks (rocm_yolo.trainer.callbacks.trackers): the module, the global it calls its library
# by, and the library's functions rocm-yolo adjusts, called where the callback opens its run: in
# on_pretrain_routine_end, or on_pretrain_routine_start (W&B's, up to 8.4.158 at least).
TRACKER_CALLBACKS = {
    "mlflow": ("ultralytics.utils.callbacks.mlflow", "mlflow", ("start_run", "log_params")),
    "wandb": ("ultralytics.utils.callbacks.wb", "wb", ("init",)),
}
TRACKER_EVENTS = ("on_pretrain_routine_start", "on_pretrain_routine_end")
TRACKER_FEATURES = {
    key: f"one {name} run across restarts and resumes" for key, name in (("mlflow", "MLflow"), ("wandb", "W&B"))
}
MLFLOW_ACTIVE = "_mlflow_active"  # the trainer attribute Ultralytics' MLflow callback tracks the run with
# The Ultralytics events rocm-yolo's callbacks use (rocm_yolo.trainer.callbacks.registry registers them).
CALLBACK_EVENTS = (
    "on_pretrain_routine_start",
    "on_pretrain_routine_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_fit_epoch_end",
    "on_val_start",
    "on_val_batch_end",
    "on_model_save",
    "on_train_end",
)


@dataclass(frozen=True)
class Requirement:
    what: str  # the internal, e.g. "InfiniteDataLoader.reset()"
    feature: str  # the rocm-yolo feature that needs it
    essential: bool
    present: Callable[[], bool]
    owner: str = "ultralytics"  # whose version to name


def _callbacks() -> bool:
    from ultralytics.utils.callbacks.base import default_callbacks

    return all(event in default_callbacks for event in CALLBACK_EVENTS)


def _trainer():
    from ultralytics.engine.trainer import BaseTrainer

    return BaseTrainer


def source(fn) -> str:
    """The source of ``fn`` as installed, or '' when it cannot be read."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _method_source(cls, name: str) -> str:
    """The source of ``cls.name`` as the package ships it.

    A plugin that replaced the method with a wrapper (without ``functools.wraps``) must not make
    Ultralytics look changed: when the attribute is not the class's own definition, the
    definition is read from the class's source file instead.
    """
    fn = inspect.unwrap(cls.__dict__.get(name) or getattr(cls, name, None))
    qualname = getattr(fn, "__qualname__", "")
    if qualname == f"{cls.__qualname__}.{name}" and getattr(fn, "__module__", None) == cls.__module__:
        return source(fn)
    text = source(inspect.getmodule(cls))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return ast.get_source_segment(text, item) or ""
    return ""


def _trainer_source(name: str) -> str:
    return _method_source(_trainer(), name)


def _workers_zeroed_before_callback() -> bool:
    text = _trainer_source("__init__")
    zeroed, callback = text.find("self.args.workers = 0"), text.find('run_callbacks("on_pretrain_routine_start")')
    return 0 <= zeroed < callback or (zeroed < 0 and callback >= 0)


def _checkpoint_schema() -> bool:
    text = _trainer_source("save_model")
    return all(f'"{key}"' in text or f"'{key}'" in text for key in CHECKPOINT_KEYS)


def _loader_reset() -> bool:
    from ultralytics.data.build import InfiniteDataLoader

    return callable(getattr(InfiniteDataLoader, "reset", None)) and "iterator" in source(InfiniteDataLoader)


def _close_stops_iterator_workers() -> bool:
    from ultralytics.data.build import InfiniteDataLoader

    return "_shutdown_workers" in _method_source(InfiniteDataLoader, "close")


def _loop_locals() -> bool:
    """``_do_train`` numbers batches with ``enumerate(self.train_loader)`` and keeps its position in locals."""
    code = _trainer()._do_train.__code__
    names = set(code.co_varnames) | set(code.co_cellvars)
    frame_writable = sys.version_info >= (3, 13) or hasattr(ctypes.pythonapi, "PyFrame_LocalsToFast")
    return frame_writable and all(n in names for n in LOOP_LOCALS) and LOOP_SOURCE in _trainer_source("_do_train")


def _lazy_loader_iterator() -> bool:
    """``InfiniteDataLoader.__init__`` leaves ``iterator`` None: no pass over the data is drawn before the first batch.

    Read from the source, not by building a loader: this is also checked after the DataLoader
    patch is installed, which would log the loader.
    """
    from ultralytics.data.build import InfiniteDataLoader

    return (
        re.search(r"self\.iterator(\s*:[^=\n]+)?\s*=\s*None\b", _method_source(InfiniteDataLoader, "__init__"))
        is not None
    )


def _running_loss_dict() -> bool:
    """``trainer.tloss`` is a dict of loss tensors (saved and restored with the loop's position)."""
    return "self.loss_items.items()" in _trainer_source("_do_train")


def _resume_hook() -> bool:
    setup = _trainer_source("_setup_train")
    return "self.resume_training(ckpt)" in setup and "start_epoch" in _trainer_source("resume_training")


def _sampler_chain() -> bool:
    from ultralytics.data.build import _RepeatSampler, build_dataloader

    return "self.sampler = sampler" in source(_RepeatSampler) and "generator=generator" in source(build_dataloader)


def _resume_save_dir() -> bool:
    """A resume passes ``save_dir`` (the run directory where the checkpoint is now) through check_resume."""
    return '"save_dir"' in _trainer_source("check_resume")


def _epoch_save() -> bool:
    """``save_model`` writes through the trainer's ``last`` and ``best`` paths (patches.saves.epoch_save swaps them)."""
    text = _trainer_source("save_model")
    return "self.last.write_bytes(" in text and "self.best.write_bytes(" in text


def _final_strip() -> bool:
    """``final_eval`` rewrites last.pt and best.pt through the module global ``strip_optimizer``."""
    import ultralytics.engine.trainer as module

    return callable(module.__dict__.get("strip_optimizer")) and "strip_optimizer(self.last)" in _trainer_source(
        "final_eval"
    )


def _seed_worker() -> bool:
    """Ultralytics' ``worker_init_fn`` reseeds random and NumPy from ``torch.initial_seed()`` (threads.worker_seeds)."""
    from ultralytics.data import build

    return "torch.initial_seed() % 2**32" in source(getattr(build, "seed_worker", None))


def _user_checks() -> bool:
    """Every Ultralytics function triage takes for a check of the user's input is defined where it says."""
    import importlib

    from rocm_yolo.ultralytics_rules.user_checks import USER_CHECKS

    def defined(module, name: str) -> bool:
        classes = (c for c in vars(module).values() if isinstance(c, type) and c.__module__ == module.__name__)
        return callable(getattr(module, name, None)) or any(callable(getattr(c, name, None)) for c in classes)

    return all(
        defined(importlib.import_module(module), name) for module, names in USER_CHECKS.items() for name in names
    )


def _tracker_callback(key: str) -> bool:
    """Ultralytics' callback ``key`` opens its run through its module global (and the MLflow one keeps
    ``trainer._mlflow_active``). Read from its file: importing it imports mlflow or wandb."""
    import importlib.util

    module, name, functions = TRACKER_CALLBACKS[key]
    found = importlib.util.find_spec(module)
    with open(found.origin, encoding="utf-8") as f:
        text = f.read()
    opens = any(f"def {event}(" in text for event in TRACKER_EVENTS)
    return opens and all(f"{name}.{fn}(" in text for fn in functions) and (key != "mlflow" or MLFLOW_ACTIVE in text)


def _cfg_key_sets() -> bool:
    import ultralytics.cfg as cfg

    return all(hasattr(cfg, name) for name in ("CFG_INT_KEYS", "CFG_FLOAT_KEYS", "CFG_FRACTION_KEYS", "CFG_BOOL_KEYS"))


TRACKER_REQUIREMENTS = {
    key: Requirement(
        f"{TRACKER_CALLBACKS[key][0]} opening its run with {', '.join(f'{name}.{fn}' for fn in functions)}",
        feature,
        False,
        functools.partial(_tracker_callback, key),
    )
    for key, feature in TRACKER_FEATURES.items()
    for name, functions in [TRACKER_CALLBACKS[key][1:]]
}
REQUIREMENTS = (
    Requirement(f"trainer callbacks {', '.join(CALLBACK_EVENTS)}", "the heartbeat and the watchdog", True, _callbacks),
    Requirement(
        f"checkpoint keys {', '.join(CHECKPOINT_KEYS)} in BaseTrainer.save_model",
        "resume and the watchdog's restarts",
        True,
        _checkpoint_schema,
    ),
    Requirement(
        "BaseTrainer.get_dataloader(..., mode=)",
        "train/val loader roles (validation worker cap, loader log)",
        False,
        lambda: callable(getattr(_trainer(), "get_dataloader", None)),
    ),
    Requirement(
        "BaseTrainer.__init__ zeroing workers before on_pretrain_routine_start",
        "restoring the requested workers on the CPU",
        False,
        _workers_zeroed_before_callback,
    ),
    Requirement(
        "InfiniteDataLoader.reset() and .iterator",
        "fresh workers every epoch (non-persistent profiles)",
        False,
        _loader_reset,
    ),
    Requirement(
        "InfiniteDataLoader.close() calling iterator._shutdown_workers()",
        "stopping loader threads on close()/reset() (profile threads)",
        False,
        _close_stops_iterator_workers,
    ),
    Requirement(
        "BaseTrainer._do_train locals i, ni, nb, epoch, last_opt_step and enumerate(self.train_loader)",
        MID_EPOCH_FEATURE,
        False,
        _loop_locals,
    ),
    Requirement("BaseTrainer._setup_train calling self.resume_training(ckpt)", MID_EPOCH_FEATURE, False, _resume_hook),
    Requirement(
        "InfiniteDataLoader creating its iterator at the first batch (not in __init__)",
        MID_EPOCH_FEATURE,
        False,
        _lazy_loader_iterator,
    ),
    Requirement("BaseTrainer.tloss as a dict of losses", MID_EPOCH_FEATURE, False, _running_loss_dict),
    Requirement(
        "_RepeatSampler(BatchSampler(sampler)) with a seeded generator in build_dataloader",
        MID_EPOCH_FEATURE,
        False,
        _sampler_chain,
    ),
    Requirement(
        "BaseTrainer.check_resume letting save_dir through",
        "resuming a moved or copied run directory in place",
        False,
        _resume_save_dir,
    ),
    Requirement(
        "ultralytics.data.build.seed_worker reseeding from torch.initial_seed()",
        "loader threads drawing the augmentations worker processes would (profile threads)",
        False,
        _seed_worker,
    ),
    Requirement(
        "Ultralytics' input checks named in ultralytics_rules.user_checks (check_det_dataset, check_cfg, ...)",
        "errors raised by Ultralytics' checks of the data, model and arguments reported as the user's "
        "(exit 2, not an internal error)",
        False,
        _user_checks,
    ),
    Requirement(
        "CFG_INT_KEYS/CFG_FLOAT_KEYS/CFG_FRACTION_KEYS/CFG_BOOL_KEYS in ultralytics.cfg",
        "type checks of KEY=VALUE before start (Ultralytics still checks them in the child)",
        False,
        _cfg_key_sets,
    ),
    Requirement(
        "BaseTrainer.save_model writing self.last and self.best with write_bytes",
        EPOCH_SAVE_FEATURE,
        False,
        _epoch_save,
    ),
    Requirement(
        "BaseTrainer.final_eval calling ultralytics.engine.trainer.strip_optimizer",
        FINAL_SAVE_FEATURE,
        False,
        _final_strip,
    ),
    *TRACKER_REQUIREMENTS.values(),
)


def version(owner: str) -> str:
    try:
        module = __import__(owner)
        return f"{owner} {getattr(module, '__version__', '?')}"
    except Exception:  # noqa: BLE001
        return f"{owner} (unimportable)"


def missing(requirements: tuple[Requirement, ...] | None = None) -> list[Requirement]:
    """The requirements (default: Ultralytics' :data:`REQUIREMENTS`) this installation does not meet."""
    out = []
    for req in REQUIREMENTS if requirements is None else requirements:
        try:
            ok = bool(req.present())
        except Exception:  # noqa: BLE001 - a changed internal may fail any way
            ok = False
        if not ok:
            out.append(req)
    return out


def missing_for(feature: str) -> list[Requirement]:
    """The unmet Ultralytics requirements of one rocm-yolo feature."""
    return [r for r in missing() if r.feature == feature]


def check(requirements: tuple[Requirement, ...] | None = None) -> list[str]:
    """Raise :class:`SetupError` for a missing essential internal; the warnings for degradable ones, and
    one for an Ultralytics outside the tested range. ``requirements``: Ultralytics' :data:`REQUIREMENTS`
    and the torch internals of the patches installed. A torch older than the tested ones is a warning too."""
    gone = missing(requirements)
    essential = [r for r in gone if r.essential]
    if essential:
        r = essential[0]
        raise SetupError(
            f"{version(r.owner)} lacks {r.what}, which rocm-yolo needs for {r.feature}: "
            f"install a supported version (pip install 'ultralytics{SUPPORTED_ULTRALYTICS}')"
        )
    warnings = [
        f"{version(r.owner)} lacks {r.what}: {r.feature} is off (supported: ultralytics{SUPPORTED_ULTRALYTICS})"
        for r in gone
    ]
    import torch
    import ultralytics

    outside = [untested(getattr(ultralytics, "__version__", "?")), untested_torch(torch.__version__)]
    return [x for x in outside if x] + warnings
