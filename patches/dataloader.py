"""Fork-safe DataLoaders: one patch on ``torch.utils.data.DataLoader.__init__``.

Every DataLoader created while the patch is installed, Ultralytics' ``InfiniteDataLoader``
included (it calls ``DataLoader.__init__`` through ``super()``), gets the run's loader
settings when it has worker processes:

- ``multiprocessing_context``: the profile's start method (the preloaded fork server,
  :mod:`rocm_yolo.trainer.loaders.forkserver`, by default), unless the loader chose one itself (a
  user's explicit ``start_method=`` wins over both);
- ``persistent_workers``, ``prefetch_factor``, ``pin_memory`` and ``timeout`` from the profile;
- ``worker_init_fn`` wrapped by :class:`WorkerInit`, which registers faulthandler in the
  worker (workers made by spawn or the fork server inherit no signal handlers) and records
  how the worker was made.

A loader with ``num_workers=0`` only gets ``pin_memory``: torch rejects the other settings
there; under a ``threads`` setting (profile ``threads``) it is marked to load in threads of
this process instead (:mod:`rocm_yolo.patches.threads`, installed with this patch). Loaders
built while :func:`loader_role` says ``"val"`` are capped at the profile's validation worker
count. The patch is idempotent (installing again only updates the
settings) and :func:`uninstall` puts the original function object back.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import inspect
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch.utils.data

from rocm_yolo.patches import threads
from rocm_yolo.process.lifecycle import DUMP_SIGNAL, alive, die_with_parent  # DUMP_SIGNAL: the watchdog's stack dump
from rocm_yolo.run import hooks
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.profiles import LoaderSettings
from rocm_yolo.ultralytics_rules import compat

# torch internals this patch relies on (checked at start-up with Ultralytics' own, rocm_yolo.ultralytics_rules.compat)
DATALOADER_ARGS = (
    "num_workers",
    "multiprocessing_context",
    "persistent_workers",
    "prefetch_factor",
    "pin_memory",
    "timeout",
    "worker_init_fn",
)


def _dataloader_args() -> bool:
    params = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    return all(name in params for name in DATALOADER_ARGS)


def _iterator_workers() -> bool:
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    return "self._workers" in compat.source(_MultiProcessingDataLoaderIter.__init__) + compat.source(
        getattr(_MultiProcessingDataLoaderIter, "_reset", None) or (lambda: None)
    )


REQUIREMENTS = (
    compat.Requirement(
        f"DataLoader({', '.join(DATALOADER_ARGS)})", "spawn-safe DataLoaders", True, _dataloader_args, owner="torch"
    ),
    compat.Requirement(
        "DataLoader iterator ._workers", "worker PIDs in the events log", False, _iterator_workers, owner="torch"
    ),
)

_original_init: Callable | None = None
_settings: LoaderSettings | None = None
_run_dir: Path | None = None
_role = threading.local()
_built: list[dict] = []  # one entry per loader built under the patch, for the run log


def installed() -> bool:
    return _original_init is not None


def settings() -> LoaderSettings | None:
    return _settings


def built_loaders() -> list[dict]:
    """What each loader built under the patch really got (role, requested and applied workers, ...)."""
    return list(_built)


@contextlib.contextmanager
def loader_role(role: str):
    """Loaders built inside this block are ``role`` ("train" or "val") for capping and logging."""
    previous = getattr(_role, "value", None)
    _role.value = role
    try:
        yield
    finally:
        _role.value = previous


def install(loader_settings: LoaderSettings | Mapping[str, Any], run_dir: str | os.PathLike | None = None) -> None:
    """Install the patch (or update its settings if it is installed already)."""
    global _original_init, _settings, _run_dir
    if not isinstance(loader_settings, LoaderSettings):
        loader_settings = LoaderSettings.from_dict(loader_settings)
    _settings = loader_settings
    _run_dir = Path(run_dir) if run_dir is not None else None
    if loader_settings.threads:
        threads.install()
    if _original_init is not None:
        return
    original = torch.utils.data.DataLoader.__dict__["__init__"]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        del arguments["self"]
        role, s = getattr(_role, "value", None), _settings
        if s is not None:
            arguments = _apply(arguments, s, role, type(self).__name__)
        original(self, **arguments)
        if s is not None and s.threads and self.num_workers == 0:
            _threads(self, s, role)

    __init__.__rocm_yolo_patch__ = True
    torch.utils.data.DataLoader.__init__ = __init__
    _original_init = original


def uninstall() -> None:
    """Restore the original ``DataLoader.__init__`` exactly; a no-op when not installed."""
    global _original_init, _settings, _run_dir
    if _original_init is None:
        return
    torch.utils.data.DataLoader.__init__ = _original_init
    _original_init, _settings, _run_dir = None, None, None
    _built.clear()
    threads.uninstall()


def _threads(loader, s: LoaderSettings, role: str | None) -> None:
    """Mark a loader without workers to load in ``s.threads`` threads (``val_workers`` caps validation)."""
    n = min(s.threads, s.val_workers) if role == "val" and s.val_workers is not None else s.threads
    plan = threads.attach(loader, n, s.prefetch_factor, s.timeout, role, _run_dir)
    if plan is not None:
        _built[-1].update(threads=plan.threads, prefetch_factor=plan.prefetch, timeout=plan.timeout)


def _apply(arguments: dict, s: LoaderSettings, role: str | None, cls_name: str) -> dict:
    requested = int(arguments.get("num_workers", 0) or 0)
    workers = requested
    if role == "val" and s.val_workers is not None:
        workers = min(workers, s.val_workers)
    arguments["num_workers"] = workers
    if s.pin_memory is not None:
        arguments["pin_memory"] = s.pin_memory
    if workers > 0:
        if arguments.get("multiprocessing_context") is None or s.start_method_explicit:
            arguments["multiprocessing_context"] = s.start_method
        arguments["persistent_workers"] = s.persistent_workers
        arguments["prefetch_factor"] = s.prefetch_factor
        arguments["timeout"] = s.timeout
        arguments["worker_init_fn"] = WorkerInit(arguments.get("worker_init_fn"), _run_dir, role)
    else:
        arguments["multiprocessing_context"] = None
        arguments["persistent_workers"] = False
        arguments["prefetch_factor"] = None
    ctx = arguments.get("multiprocessing_context")
    method = ctx if isinstance(ctx, str) or ctx is None else ctx.get_start_method()
    _built.append(
        {
            "role": role or "other",
            "class": cls_name,
            "requested_workers": requested,
            "workers": workers,
            "start_method": method if workers else None,
            "persistent_workers": arguments.get("persistent_workers", False),
            "prefetch_factor": arguments.get("prefetch_factor"),
            "pin_memory": bool(arguments.get("pin_memory", False)),
            "timeout": arguments.get("timeout", 0),
        }
    )
    return arguments


def describe(entry: Mapping) -> str:
    """One log line for a loader entry of :func:`built_loaders`."""
    capped = f" (requested {entry['requested_workers']})" if entry["requested_workers"] != entry["workers"] else ""
    if not entry["workers"] and entry.get("threads"):
        return (
            f"{entry['role']} loader: workers=0{capped} threads={entry['threads']} (in the trainer process) "
            f"prefetch={entry['prefetch_factor']} pin_memory={str(entry['pin_memory']).lower()} "
            f"timeout={entry['timeout']:g}"
        )
    if not entry["workers"]:
        pin = str(entry["pin_memory"]).lower()
        return f"{entry['role']} loader: workers=0{capped} (in the main process), pin_memory={pin}"
    return (
        f"{entry['role']} loader: workers={entry['workers']}{capped} start={entry['start_method']} "
        f"persistent={str(entry['persistent_workers']).lower()} prefetch={entry['prefetch_factor']} "
        f"pin_memory={str(entry['pin_memory']).lower()} timeout={entry['timeout']:g}"
    )


def _how_made() -> str:
    """How this process was started, from its real command line: spawn, forkserver or fork."""
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return "unknown"
    if b"spawn_main" in cmdline:
        return "spawn"
    if b"forkserver" in cmdline:
        return "forkserver"
    return "fork"


class WorkerInit:
    """A picklable ``worker_init_fn`` wrapper, run first thing in every DataLoader worker.

    It registers faulthandler on :data:`DUMP_SIGNAL` (stack file ``stacks/worker-PID.txt`` in
    the run's rocm-yolo directory), appends one JSON line about the worker to
    ``workers.jsonl`` there, arms fault injection (tests and benchmarks only), then calls the
    loader's own ``worker_init_fn``.
    """

    def __init__(self, inner: Callable | None, run_dir: Path | None, role: str | None):
        self.inner = inner
        self.run_dir = str(run_dir) if run_dir is not None else None
        self.role = role or "other"
        self.trainer_pid = os.getpid()  # the process that builds the loader makes its workers

    def __call__(self, worker_id: int) -> None:
        if self.run_dir is not None:
            self._register(worker_id)
        info = torch.utils.data.get_worker_info()
        hooks.arm_worker(info.dataset if info else None, self.run_dir)  # tests only: ROCM_YOLO_FAULT=worker-hang
        if self.inner is not None:
            self.inner(worker_id)

    def _register(self, worker_id: int) -> None:
        # A worker stuck in native code dies with its parent all the same (the trainer, or the
        # fork server, which dies with the trainer); one that finishes starting after the
        # trainer died goes at once (torch's own watchdog would then take the new parent,
        # init, for the trainer and wait forever).
        parent = os.getppid()
        die_with_parent(parent)
        if parent != self.trainer_pid and not alive(self.trainer_pid):
            os.kill(os.getpid(), 9)
        paths = RunPaths(self.run_dir)
        paths.stacks.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        handle = open(paths.worker_stacks(pid), "a")  # kept open for the life of the worker
        faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
        info = torch.utils.data.get_worker_info()
        record = {
            "pid": pid,
            "ppid": parent,
            "trainer": self.trainer_pid,
            "role": self.role,
            "worker_id": worker_id,
            "num_workers": info.num_workers if info else None,
            "start_method": _how_made(),
            "time": time.time(),
        }
        with open(paths.workers, "a") as f:
            f.write(json.dumps(record) + "\n")


def dead_workers(loaders, wait: float = 2.0) -> list[tuple[int, int | None]]:
    """``(pid, exit code)`` of the worker processes of ``loaders`` that have died, waiting up to ``wait`` s.

    torch turns a worker death into "DataLoader worker (pid(s) ...) exited unexpectedly" only if
    ``is_alive()`` already says so when the data queue fails. A worker killed while it hands over
    a batch makes the queue fail at once (``ConnectionResetError`` from the file-descriptor
    sharing), and under the fork server its exit status reaches this process a moment later
    (the server reaps it and reports through a pipe): the error then names no worker. This
    looks again, as torch would have a moment later. An iterator without worker processes
    (``workers=0``, loader threads) has none.
    """
    procs = []
    for loader in loaders:
        iterator = getattr(loader, "iterator", None) or getattr(loader, "_iterator", None)
        procs += list(getattr(iterator, "_workers", None) or [])
    deadline = time.monotonic() + wait
    while procs:
        dead = [(w.pid, w.exitcode) for w in procs if not w.is_alive()]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)
    return []
