"""Per-thread random generators behind the module-level ``random.*`` and ``numpy.random.*``.

Ultralytics' augmentations draw from the global generators (``random.uniform``,
``random.choices``, ``np.random.uniform``, ``np.random.beta``, ...). A DataLoader worker
process has its own copy of them, seeded by torch; loader threads inside one process would
share one, and which thread drew which number would depend on the scheduling: ``seed=``
would no longer reproduce a run. So while this patch is installed, every module-level
function of ``random`` and of ``numpy.random`` that uses the hidden global generator
(``random._inst``, ``numpy.random.mtrand._rand``) dispatches to the calling thread's own
generator if :func:`bind` gave it one, and to the original global generator otherwise: the
main thread and every thread that is not a loader thread see no change at all.

Only calls made through the module (``random.uniform(...)``, ``np.random.uniform(...)``)
are dispatched, which is how Ultralytics makes them; a function imported before the patch
by name (``from random import uniform``) keeps the global generator. Explicit generator
objects (``random.Random(...)``, ``np.random.default_rng()``) are untouched.

The cost is one thread-local lookup per call (well under a microsecond). :func:`install`
is idempotent; :func:`uninstall` puts the original function objects back.
"""

from __future__ import annotations

import random
import threading
from typing import Callable

import numpy as np

from rocm_yolo.patches.swap import Swaps

_local = threading.local()
_swaps = Swaps()  # the module-level functions of random and numpy.random


def _random_names() -> list[str]:
    state = getattr(random, "_inst", None)
    return [
        n
        for n in dir(random)
        if not n.startswith("_") and getattr(getattr(random, n), "__self__", None) is state and state is not None
    ]


def _numpy_names() -> list[str]:
    state = getattr(getattr(np.random, "mtrand", None), "_rand", None)
    if state is None:
        return []
    bound = [
        n for n in dir(np.random) if not n.startswith("_") and getattr(getattr(np.random, n), "__self__", None) is state
    ]
    # plain functions of numpy.random that use the global state too
    return bound + [n for n in ("seed", "ranf", "sample") if hasattr(np.random, n) and n not in bound]


_NUMPY_ALIASES = {"ranf": "random_sample", "sample": "random_sample"}  # functions without a RandomState method


def _dispatcher(original: Callable, slot: str, method: str) -> Callable:
    def dispatch(*args, **kwargs):
        generator = getattr(_local, slot, None)
        if generator is None:
            return original(*args, **kwargs)
        return getattr(generator, method)(*args, **kwargs)

    dispatch.__name__ = getattr(original, "__name__", method)
    dispatch.__doc__ = getattr(original, "__doc__", None)
    dispatch.__wrapped__ = original
    return dispatch


def patchable() -> bool:
    """Whether both hidden global generators are where this patch looks for them."""
    return bool(_random_names()) and bool(_numpy_names())


def installed() -> bool:
    return _swaps.installed()


def install() -> None:
    """Make the module-level functions dispatch to the calling thread's generators (idempotent)."""
    if _swaps.installed():
        return
    for module, names, slot in ((random, _random_names(), "random"), (np.random, _numpy_names(), "numpy")):
        for name in names:
            method = _NUMPY_ALIASES.get(name, name) if module is np.random else name
            _swaps.replace(module, name, lambda original, slot=slot, method=method: _dispatcher(original, slot, method))


def uninstall() -> None:
    """Put every original function object back; a no-op when not installed."""
    _swaps.restore()


def bind(random_seed: int, numpy_seed) -> None:
    """Give the calling thread its own generators, seeded as a DataLoader worker's would be."""
    _local.random = random.Random(random_seed)
    _local.numpy = np.random.RandomState(numpy_seed)


def unbind() -> None:
    """The calling thread uses the global generators again."""
    _local.random = None
    _local.numpy = None


def bound() -> bool:
    return getattr(_local, "random", None) is not None
