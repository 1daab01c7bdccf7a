"""Fork-safe DataLoaders: one patch on ``torch.utils.data.DataLoader.__init__``, keeping torch's contract.

Every DataLoader created while the patch is installed, Ultralytics' ``InfiniteDataLoader``
included (it calls ``DataLoader.__init__`` through ``super()``), gets the run's loader
settings when it has worker processes. Whose settings win depends on who built the loader:

- the run's own loaders, built by Ultralytics' trainer (:func:`loader_role` says "train" or
  "val"): the profile's ``persistent_workers``, ``prefetch_factor``, ``pin_memory`` and
  ``timeout`` replace Ultralytics' own choices (the profile is what keeps them from hanging,
  and the start-up line says so); validation is capped at the profile's worker count;
- any other loader (a user's own, torch's tests): what the caller passed wins. The profile
  only fills what the caller left out (start method, ``prefetch_factor``, ``pin_memory``,
  ``timeout``), never ``persistent_workers`` (torch's default, fresh workers every epoch, holds),
  and a combination torch refuses (``num_workers=0`` with ``prefetch_factor``, ...) reaches
  torch and is refused as torch refuses it;

and in both, the start method is the profile's (the preloaded fork server,
:mod:`rocm_yolo.trainer.forkserver.server`, by default) unless the loader chose one, and
``worker_init_fn`` is wrapped by :class:`WorkerInit`, which registers faulthandler in the
worker and records how the worker was made. Workers that are not this process's children
(the fork server's) are watched by :mod:`rocm_yolo.patches.loaders.worker_deaths`, installed with this
patch: one killed by a signal is reported as torch reports it, as fast.

Before a loader whose workers start by a fork server or spawn is built, what they must receive
is checked (:func:`check_sendable`, :func:`check_main_guard`): a dataset, ``worker_init_fn`` or
``collate_fn`` defined inside a function, or a script without an ``if __name__ == "__main__":``
guard, is refused in one line (:class:`LoaderArgumentError`), not by a traceback from inside
a worker. The dataset's module is imported once by the fork server (:mod:`rocm_yolo.trainer.forkserver.preimport`).

One of the run's own loaders with ``num_workers=0`` under a ``threads`` setting (profile ``threads``)
is marked to load in threads of this process instead (:mod:`rocm_yolo.patches.loaders.threads`, installed with this
patch). The patch is idempotent (installing again only updates the settings) and
:func:`uninstall` puts the original function object back.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch.utils.data

from rocm_yolo.errors import UsageError
from rocm_yolo.patches.loaders import threads, worker_deaths
from rocm_yolo.patches.swap import Swaps
from rocm_yolo.process.lifecycle import alive, die_with_parent, dump_stacks_into
from rocm_yolo.run import hooks
from rocm_yolo.run.atomic import append_log
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import LoaderSettings
from rocm_yolo.trainer.forkserver import preimport
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

_swaps = Swaps()  # DataLoader.__init__
_settings: LoaderSettings | None = None
_run_dir: Path | None = None
_role = threading.local()
_built: list[dict] = []  # one entry per loader built under the patch, for the run log
OWN_ROLES = ("train", "val")  # the run's loaders, built by Ultralytics' trainer: the profile's settings win
SENT_BY_PICKLE = ("forkserver", "spawn")  # start methods whose workers receive the loader pickled


class LoaderArgumentError(UsageError):
    """A loader whose workers cannot start as configured (a ``ValueError``, as torch's own refusals)."""


def installed() -> bool:
    return _swaps.installed()


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
    global _settings, _run_dir
    if not isinstance(loader_settings, LoaderSettings):
        loader_settings = LoaderSettings.from_dict(loader_settings)
    _settings = loader_settings
    _run_dir = Path(run_dir) if run_dir is not None else None
    if loader_settings.threads:
        threads.install()
    worker_deaths.install()
    _swaps.replace(torch.utils.data.DataLoader, "__init__", _applying)


def _applying(original):
    """``DataLoader.__init__`` with the run's settings applied by :func:`_apply` (the ones of the time of the call)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        del arguments["self"]
        role, s = getattr(_role, "value", None), _settings
        entry = None
        if s is not None:
            arguments, entry = _apply(arguments, s, role, type(self).__name__)
        original(self, **arguments)
        if entry is not None:
            _built.append(entry)
            if s.threads and self.num_workers == 0 and role in OWN_ROLES:  # another loader loads as built
                _threads(self, s, role)

    return __init__


def uninstall() -> None:
    """Restore the original ``DataLoader.__init__`` exactly; a no-op when not installed."""
    global _settings, _run_dir
    if not _swaps.installed():
        return
    _swaps.restore()
    _settings, _run_dir = None, None
    _built.clear()
    threads.uninstall()
    worker_deaths.uninstall()


def _threads(loader, s: LoaderSettings, role: str | None) -> None:
    """Mark a loader without workers to load in ``s.threads`` threads (``val_workers`` caps validation)."""
    n = min(s.threads, s.val_workers) if role == "val" and s.val_workers is not None else s.threads
    plan = threads.attach(loader, n, s.prefetch_factor, s.timeout, role, _run_dir)
    if plan is not None:
        _built[-1].update(threads=plan.threads, prefetch_factor=plan.prefetch, timeout=plan.timeout)


def _apply(arguments: dict, s: LoaderSettings, role: str | None, cls_name: str) -> tuple[dict, dict | None]:
    """The arguments the original ``__init__`` gets, and the loader's entry for the run log (None: left to torch)."""
    requested = arguments.get("num_workers", 0)
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        return arguments, None  # torch's own error
    ours = role in OWN_ROLES
    given = set(arguments)
    workers = min(requested, s.val_workers) if ours and role == "val" and s.val_workers is not None else requested
    if workers != requested:
        arguments["num_workers"] = workers

    def setting(key: str, value: Any) -> None:  # the run's loaders take the profile's; others keep their own
        if ours or key not in given:
            arguments[key] = value

    if s.pin_memory is not None:
        setting("pin_memory", s.pin_memory)
    if workers > 0:
        if arguments.get("multiprocessing_context") is None:  # a loader that chose its start method keeps it
            arguments["multiprocessing_context"] = s.start_method
        if ours:
            arguments["persistent_workers"] = s.persistent_workers
        setting("prefetch_factor", s.prefetch_factor)
        setting("timeout", s.timeout)
        method = _start_method(arguments["multiprocessing_context"])
        if method in SENT_BY_PICKLE:
            check_sendable(arguments, method)
            check_main_guard(method)
            if method == "forkserver":
                preimport.want(_modules(arguments))
        arguments["worker_init_fn"] = WorkerInit(arguments.get("worker_init_fn"), _run_dir, role)
    elif requested > 0:  # the validation cap left none: what the loader set for its workers goes with them
        for key in ("multiprocessing_context", "persistent_workers", "prefetch_factor"):
            arguments.pop(key, None)
    entry = {
        "role": role or "other",
        "class": cls_name,
        "requested_workers": requested,
        "workers": workers,
        "start_method": _start_method(arguments.get("multiprocessing_context")) if workers else None,
        "persistent_workers": bool(arguments.get("persistent_workers", False)),
        "prefetch_factor": arguments.get("prefetch_factor"),
        "pin_memory": bool(arguments.get("pin_memory", False)),
        "timeout": arguments.get("timeout", 0),
        "settings": "profile" if ours else "caller",
    }
    return arguments, entry


def _start_method(context: Any) -> str | None:
    """The start method a ``multiprocessing_context`` argument names (None for torch's default or a bad value)."""
    if context is None or isinstance(context, str):
        return context
    try:
        return context.get_start_method()
    except Exception:  # noqa: BLE001 - not a context: torch refuses it with its own error
        return None


SENT_TO_WORKERS = ("dataset", "worker_init_fn", "collate_fn")  # what a worker receives of its loader


def _owner(obj: Any) -> Any:
    """The class or function a worker finds ``obj`` by (an instance: its class; a partial: its function)."""
    if isinstance(obj, functools.partial):
        return _owner(obj.func)
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return obj
    return type(obj)


def _modules(arguments: Mapping) -> list[str]:
    """The modules a worker imports to unpickle its dataset, ``worker_init_fn`` and ``collate_fn``."""
    found = [getattr(_owner(arguments[key]), "__module__", None) for key in SENT_TO_WORKERS if arguments.get(key)]
    return [m for m in found if m and m != "builtins"]


def _reference_problem(obj: Any) -> str | None:
    """Why ``obj`` cannot be pickled by reference (what a worker needs of it), or None."""
    if inspect.ismethod(obj):
        return _reference_problem(type(obj.__self__)) or _reference_problem(obj.__func__)
    target = _owner(obj)
    if target is not obj:
        return _reference_problem(target)
    qualname = getattr(target, "__qualname__", "")
    if qualname == "<lambda>":
        return "is a lambda"
    if "<locals>" in qualname:
        return "is defined inside a function"
    try:
        pickle.dumps(target)  # by reference: the module and the name, never the data
    except Exception as e:  # noqa: BLE001 - pickle raises several types
        return f"cannot be pickled ({type(e).__name__})"
    return None


def _name(obj: Any) -> str:
    owner = _owner(obj)
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', repr(owner))}"


def check_sendable(arguments: Mapping, method: str) -> None:
    """Refuse, in one line, a dataset, ``worker_init_fn`` or ``collate_fn`` the workers cannot receive.

    Workers started by ``method`` (a fork server or spawn) receive them pickled, and a class or
    function defined inside a function pickles as nothing they can find: torch would fail in
    every worker with "Can't pickle local object". Only the class or function is checked, by
    reference; the dataset's data is never pickled here.
    """
    for what in SENT_TO_WORKERS:
        obj = arguments.get(what)
        if obj is None:
            continue
        problem = _reference_problem(obj if what != "dataset" else type(obj))
        if problem:
            raise LoaderArgumentError(
                f"the DataLoader's {what} {_name(obj)} {problem}: its workers (started by {method}) "
                f"receive it pickled and cannot find it; define it at the top level of a module"
            )


@functools.lru_cache(maxsize=8)
def _guarded_lines(path: str) -> tuple[tuple[int, int], ...] | None:
    """The line ranges of ``if __name__ == "__main__":`` blocks at the top of a script (None: unreadable)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None

    def is_main_test(test: ast.expr) -> bool:
        if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
            return False
        sides = [test.left, *test.comparators]
        names = [x for x in sides if isinstance(x, ast.Name) and x.id == "__name__"]
        mains = [x for x in sides if isinstance(x, ast.Constant) and x.value == "__main__"]
        return bool(names and mains)

    return tuple(
        (node.lineno, node.end_lineno or node.lineno)
        for node in tree.body
        if isinstance(node, ast.If) and is_main_test(node.test)
    )


def _main_path() -> str | None:
    """The main script, as multiprocessing's workers re-import it (by path: not one run with ``-m``)."""
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or not file or not file.endswith(".py"):
        return None
    return os.path.abspath(file) if os.path.isfile(file) else None


def check_main_guard(method: str) -> None:
    """Refuse, in one line, a loader built by a script's top-level code outside ``if __name__ == "__main__":``.

    Each worker started by a fork server or spawn imports the main script again (multiprocessing
    does, to find what was defined there): unguarded, it would run the script's training again
    inside every worker. A script run with ``-m`` or from ``-c`` is not re-imported by path.
    """
    script = _main_path()
    if script is None:
        return
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            guarded = _guarded_lines(script)
            line = frame.f_lineno
            if guarded is not None and not any(a <= line <= b for a, b in guarded):
                raise LoaderArgumentError(
                    f'{script}:{line} builds a DataLoader with workers outside `if __name__ == "__main__":`; '
                    f"each worker (started by {method}) imports the script again and would run it: put the "
                    f"script's training code under that guard"
                )
            return
        frame = frame.f_back


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
    whose = " (the profile's settings, over Ultralytics' own)" if entry.get("settings") == "profile" else ""
    return (
        f"{entry['role']} loader: workers={entry['workers']}{capped} start={entry['start_method']} "
        f"persistent={str(entry['persistent_workers']).lower()} prefetch={entry['prefetch_factor']} "
        f"pin_memory={str(entry['pin_memory']).lower()} timeout={entry['timeout']:g}{whose}"
    )


def _how_made() -> str:
    """How this process was started: spawn, forkserver or fork, from its real command line; a worker of a fork
    server forked from the trainer (:mod:`rocm_yolo.trainer.forkserver.server`) has the trainer's, and its
    server's mark."""
    server = sys.modules.get("rocm_yolo.trainer.forkserver.server")
    if getattr(server, "FORKED", False):
        return "forkserver"
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

    It quiets the report of a batch hand-over broken by the trainer's going
    (:func:`worker_deaths.quiet_handover_breaks`), registers faulthandler on :data:`DUMP_SIGNAL` (stack file
    ``stacks/worker-PID.txt`` in the run's rocm-yolo directory), appends one JSON line about the worker to
    ``workers.jsonl`` there, arms fault injection (tests and benchmarks only), then calls the
    loader's own ``worker_init_fn``.
    """

    def __init__(self, inner: Callable | None, run_dir: Path | None, role: str | None):
        self.inner = inner
        self.run_dir = str(run_dir) if run_dir is not None else None
        self.role = role or "other"
        self.trainer_pid = os.getpid()  # the process that builds the loader makes its workers

    def __call__(self, worker_id: int) -> None:
        worker_deaths.quiet_handover_breaks()  # a trainer stopped mid-hand-over: no traceback from this worker
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
        pid = os.getpid()
        dump_stacks_into(paths, paths.worker_stacks(pid))  # kept open for the life of the worker
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
        append_log(paths.workers, json.dumps(record) + "\n")


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
