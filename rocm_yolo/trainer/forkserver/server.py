"""DataLoader workers that start together: a fork server with torch and Ultralytics preloaded.

With ``spawn`` every worker is a new interpreter that imports torch and Ultralytics before
it can read the pickled dataset its parent writes into a 64 KiB pipe, so the parent blocks
worker by worker: 8 workers took 45 s to the first batch on a 16-core GPU machine. A fork
server fixes that without giving up what spawn is for:

- the server has torch and Ultralytics' data modules imported, then only forks. It never
  touches the GPU and runs no threads of its own, so a worker forked from it inherits no GPU
  runtime state and no lock held by a busy thread of the trainer (the pin-memory thread, a
  decoding thread): the two things ``fork`` from the trainer gets wrong. CPython 3.14 made
  forkserver its Linux default for the same reason.
- how it is made: the trainer, once it has imported those modules and before it touches the
  GPU, forks it (:func:`start`), if at that moment the trainer is as a server must be: its main
  thread alone, no GPU device file open, the GPU runtime not initialized (:func:`fork_refused`
  checks; each is read from /proc and torch, not assumed). The child then becomes what a fresh
  server would be (:func:`_as_fresh`: every other file descriptor on /dev/null, none of the
  trainer's signal handlers) and runs multiprocessing's own server. It imports nothing: a
  fresh interpreter importing torch again cost 3-4 CPU-seconds of every attempt. Where the
  trainer is not in that state, the server is a fresh interpreter (started by exec, like
  spawn), as multiprocessing makes it, and the record says why.
- a worker is a fork of that server: it starts in milliseconds, already has torch and
  Ultralytics imported, and reads its dataset at once, so workers start together. A dataset
  defined elsewhere has its module imported by the server too, once, before its next fork
  (:mod:`rocm_yolo.trainer.forkserver.preimport`): not once in every worker.

The server records what it is in ``RUN/rocm_yolo/forkserver.json`` (how it was started, threads,
GPU device files open) and dies with the trainer (``PR_SET_PDEATHSIG``); each worker dies with the
server and kills itself if the trainer is already gone (see patches/loaders/dataloader.WorkerInit).
This module does not import torch: the trainer imports it before torch.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import sys
import time

from rocm_yolo import environment
from rocm_yolo.run.devices import rank
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.trainer.forkserver import preimport

PRELOAD = "rocm_yolo.trainer.forkserver.preload"  # the module the server imports (it records the server)
# What a worker needs to unpickle an Ultralytics dataset and run it: imported before the server forks any worker.
WORKER_MODULES = (
    "torch",
    "torch.utils.data",
    "ultralytics",
    "ultralytics.data.augment",
    "ultralytics.data.build",
    "ultralytics.data.dataset",
    "rocm_yolo.patches.loaders.dataloader",  # WorkerInit, every worker's worker_init_fn
)
SINGLE_THREADED = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # unless the user set them
# A new interpreter's Python handlers, where the trainer's own give way to SIG_DFL otherwise.
FRESH_HANDLERS = {signal.SIGINT: signal.default_int_handler}
FORKED = False  # True in a server forked from the trainer (its record says how it started)
_NAMES_FD: int | None = None  # the read end of the pipe of module names, which the server gets


def start(run_dir: str | os.PathLike) -> str | None:
    """Start the preloaded fork server: forked from this process where that is safe, else a fresh interpreter.

    Call after the environment is final (the server and every worker inherit it), before this
    process touches the GPU, and before the first DataLoader with workers is iterated. It imports
    :data:`WORKER_MODULES` first (the trainer needs them too). Returns None when the server is a
    fork of this process; else why it is not, and the server is a fresh interpreter that imports
    them in the background (the first worker request waits for it).
    """
    os.environ[environment.TRAINER_PID] = str(os.getpid())  # the server dies with it
    os.environ[environment.RUN_DIR] = str(run_dir)  # where the server records itself
    try:  # the datasets' modules, named by this process over a pipe, imported once by the server
        os.environ[environment.FORKSERVER_IMPORTS] = str(_pass_to_server(preimport.channel()))
    except OSError:
        preimport.close()
        os.environ.pop(environment.FORKSERVER_IMPORTS, None)  # every worker then imports them itself
    why = import_worker_modules() or fork_refused()
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOAD])
    # The server and its workers need no math thread pools (torch sets one thread per worker
    # anyway): a fresh server then forks with no idle pool thread beside its main thread.
    saved = {key: os.environ.get(key) for key in SINGLE_THREADED}
    for key in SINGLE_THREADED:
        os.environ.setdefault(key, "1")
    try:
        if why is None:
            try:
                _fork_server()
            except OSError as e:  # no fork now (EAGAIN at a process limit, ENOMEM): a new interpreter, as before
                why = f"fork failed ({e.strerror or e})"
        if why is not None:
            multiprocessing.forkserver.ensure_running()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return why


def _pass_to_server(read_end: int) -> int:
    """The server gets ``read_end`` (the pipe of module names) at the same number, however it starts: forked (kept by
    :func:`_as_fresh`) or a new interpreter (``util.spawnv_passfds`` passes it with the server's own descriptors,
    also to a server multiprocessing starts again later). Returns it."""
    global _NAMES_FD
    _NAMES_FD = read_end
    spawn = multiprocessing.util.spawnv_passfds
    if not getattr(spawn, "__rocm_yolo_patch__", False):

        def spawnv_passfds(path, args, passfds):
            server = any("forkserver" in str(a) for a in args) and _NAMES_FD is not None
            return spawn(path, args, (*passfds, _NAMES_FD) if server else passfds)

        spawnv_passfds.__rocm_yolo_patch__ = True
        multiprocessing.util.spawnv_passfds = spawnv_passfds
    return read_end


def fork_refused() -> str | None:
    """Why this process may not become the fork server by a fork now (None: it may).

    A fork copies one thread and every byte of memory: a lock another thread held stays held in
    the child for good, and GPU runtime state does not survive a fork. So: the main thread alone
    (native threads too, read from /proc), no GPU device file open, torch's GPU runtime not started.
    """
    unfit = preimport.unfit_for_server()
    if unfit:
        return f"the trainer has {unfit}"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "the trainer has started the GPU runtime"
    return None


def import_worker_modules() -> str | None:
    """Import :data:`WORKER_MODULES`: None, or the error in one line (in the trainer, the server is then a new
    interpreter that records it; the trainer's own checked import reports a broken torch)."""
    for name in WORKER_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}".splitlines()[0][:300]
    return None


def _fork_server() -> None:
    """multiprocessing's own ``ensure_running``, with the server forked from this process instead of spawned.

    ``ensure_running`` makes the listening socket and the "alive" pipe and runs ``python -c
    'from multiprocessing.forkserver import main; main(...)'`` through ``util.spawnv_passfds``; for
    that one call, :func:`_fork_passfds` runs the same code in a fork. Everything else (the socket,
    the handshake, the client side) is the standard library's, on every Python version that starts
    its server so (3.11 to 3.14). The resource tracker, which ``ensure_running`` starts first through
    the same function, is started before, as a new interpreter.
    """
    multiprocessing.resource_tracker.ensure_running()
    for stream in (sys.stdout, sys.stderr):  # the child must not write out what this process buffered
        if stream is not None:
            stream.flush()
    spawn = multiprocessing.util.spawnv_passfds
    multiprocessing.util.spawnv_passfds = _fork_passfds
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        multiprocessing.util.spawnv_passfds = spawn


def _fork_passfds(path: str, args: list[str], passfds) -> int:
    """``util.spawnv_passfds``' contract (start ``args`` keeping ``passfds``, return the pid), by a fork that
    runs the ``-c`` code of ``args`` in this interpreter."""
    code = args[args.index("-c") + 1]
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        _as_fresh({*passfds, *_tracker_fd(), *([_NAMES_FD] if _NAMES_FD is not None else [])})
        exec(code, {"__name__": "__mp_forkserver__"})
        status = 0
    except SystemExit as e:  # the server's end: the trainer closed the alive pipe
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:  # noqa: BLE001 - as the server's interpreter would: the traceback, exit 1
        import traceback

        traceback.print_exc()
    finally:
        os._exit(status)


def _tracker_fd() -> list[int]:
    """The resource tracker's descriptor: the server registers with the trainer's tracker, as its workers do."""
    fd = getattr(multiprocessing.resource_tracker._resource_tracker, "_fd", None)
    return [fd] if isinstance(fd, int) else []


def _as_fresh(keep: set[int]) -> None:
    """Make this fork of the trainer what a server started by exec would be, but for its imports: every file
    descriptor beyond stdin, stdout, stderr and ``keep`` points at /dev/null (the trainer's files, pipes and
    locks are not the server's; the trainer's Python objects still hold valid ones), no handler of the
    trainer's for any signal (Python's, faulthandler's; an ignored signal stays ignored, as across exec), no
    wakeup fd, the interpreter's own stdout and stderr, multiprocessing's server record unlocked (this fork was
    made inside its lock)."""
    global FORKED
    FORKED = True
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null and fd not in keep:
            try:
                os.dup2(null, fd)
            except OSError:  # the descriptor listdir itself used, closed meanwhile
                pass
    os.close(null)
    signal.set_wakeup_fd(-1)
    faulthandler.disable()
    for sig in signal.valid_signals():
        try:
            faulthandler.unregister(sig)  # a stack-dump signal of the trainer's (it dumps into the trainer's file)
            if callable(signal.getsignal(sig)):  # a Python handler of the trainer's
                signal.signal(sig, FRESH_HANDLERS.get(sig, signal.SIG_DFL))
        except (OSError, ValueError, RuntimeError):  # SIGKILL, SIGSTOP, the real-time signals Python does not name
            pass
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    sys.stdout = sys.__stdout__ or sys.stdout  # not the trainer's wrappers (its terminal guard)
    sys.stderr = sys.__stderr__ or sys.stderr
    lock = multiprocessing.forkserver._forkserver._lock
    if lock.locked():
        lock.release()


def server_pid() -> int | None:
    """The fork server of this process, if one was started."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


READY_TIMEOUT = 600.0  # seconds the first batch waits for the server's imports at most (then the workers do)


class ServerReady:
    """An Ultralytics callback: before the attempt's first epoch iterates its loader, wait until the fork server
    has imported torch and Ultralytics (its record says so). That wait is start-up, reported as such by the
    heartbeat; from the next step on, workers start in milliseconds, so a first batch that never comes is a hang
    after the stall timeout, however slowly the server imported on a busy machine."""

    def __init__(self, run_dir: str | os.PathLike, timeout: float = READY_TIMEOUT):
        self.path = RunPaths(run_dir).forkserver(rank())
        self.timeout = timeout
        self.waited = False

    def on_train_epoch_start(self, trainer) -> None:
        if self.waited or server_pid() is None:
            return
        self.waited = True
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and not self._ready():
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return json.loads(self.path.read_text()).get("trainer") == os.getpid()  # this attempt's server
        except (OSError, ValueError, AttributeError):
            return False
