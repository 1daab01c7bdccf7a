"""The hook points production code offers to tests and benchmarks: real faults, a record of each batch.

Production code calls one of these functions at each hook site. Each asks the plugins named in
``$ROCM_YOLO_PLUGINS`` (:data:`rocm_yolo.environment.PLUGINS`, comma-separated module names) and
returns at once when there are none, as pytest loads the plugins named in ``PYTEST_PLUGINS``.
The plugin the tests and benchmarks name is :mod:`rocm_yolo.testing`: it sits above everything it
injects into, and nothing in rocm-yolo imports it (the fork server, and so every DataLoader
worker, never loads it unless asked). Any other module named there is passed over unless
``ROCM_YOLO_TEST_PLUGINS=1`` (:data:`rocm_yolo.environment.ANY_PLUGIN`; the tests and the benchmarks set it).
A plugin defines any of the functions below, with the same signature; the ones it lacks answer as when no plugin
is loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Callable

from rocm_yolo import environment

TESTING = "rocm_yolo.testing"  # the plugin rocm-yolo ships for its tests and benchmarks


def _plugins() -> list:
    names = [n.strip() for n in os.environ.get(environment.PLUGINS, "").split(",") if n.strip()]
    return [importlib.import_module(name) for name in names if _allowed(name)]


def _allowed(name: str) -> bool:
    """``rocm_yolo.testing`` (and its modules); any other module only where a test asks for it
    (``ROCM_YOLO_TEST_PLUGINS=1``): a variable that names a module would otherwise import whatever is on
    ``sys.path`` under that name into the trainer and every DataLoader worker."""
    return name == TESTING or name.startswith(TESTING + ".") or os.environ.get(environment.ANY_PLUGIN) == "1"


def _answers(hook: str) -> list[Callable]:
    return [fn for fn in (getattr(p, hook, None) for p in _plugins()) if fn is not None]


def trainer_callbacks(paths, attempt: int) -> list:
    """Callback owners for the trainer (fault injector, batch recorder); [] unless a plugin gives some."""
    return [owner for fn in _answers("trainer_callbacks") for owner in fn(paths, attempt)]


def checkpoint_writer(paths, where: tuple[int, int]) -> Callable | None:
    """A writer ``(ckpt, file)`` for the mid-epoch checkpoint at ``where`` (tests: a SIGKILL halfway), or None."""
    return next((w for w in (fn(paths, where) for fn in _answers("checkpoint_writer")) if w is not None), None)


def final_save(name: str, paths):
    """A context around the end of training's rewrite of ``name`` (tests stop the run halfway through it)."""
    stack = contextlib.ExitStack()
    for fn in _answers("final_save"):
        stack.enter_context(fn(name, paths))
    return stack


def epoch_save_writer(path) -> Callable | None:
    """A writer ``(file, data)`` for an epoch's save of ``path`` (last.pt, ...; tests: a stop halfway), or None."""
    return next((w for w in (fn(path) for fn in _answers("epoch_save_writer")) if w is not None), None)


def arm_worker(dataset, run_dir) -> None:
    """In a DataLoader worker, first thing (tests: ``worker-hang`` makes its ``__getitem__`` block)."""
    for fn in _answers("arm_worker"):
        fn(dataset, run_dir)


def worker_hang_check(run_dir) -> Callable[[], None] | None:
    """For loader threads: a check each runs before its next batch (tests: it blocks), or None."""
    return next((c for c in (fn(run_dir) for fn in _answers("worker_hang_check")) if c is not None), None)


def conv_fault(strategy: str) -> None:
    """In the conv self-test child, as ``strategy`` starts (tests: a HIP error, an abort, a hang)."""
    for fn in _answers("conv_fault"):
        fn(strategy)


def conv_installed(strategy: str) -> None:
    """In the conv self-test child, after ``strategy`` is installed (tests: slower, or failing in fp16)."""
    for fn in _answers("conv_installed"):
        fn(strategy)
