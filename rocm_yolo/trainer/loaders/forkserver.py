"""DataLoader workers that start together: a fork server with torch and Ultralytics preloaded.

With ``spawn`` every worker is a new interpreter that imports torch and Ultralytics before
it can read the pickled dataset its parent writes into a 64 KiB pipe, so the parent blocks
worker by worker: 8 workers took 45 s to the first batch on a 16-core GPU machine. A fork
server fixes that without giving up what spawn is for:

- the server is a *fresh* interpreter (started by exec, like spawn), started by the trainer
  before it imports torch, that imports torch and Ultralytics' data modules once and then
  only forks. It never touches the GPU and runs no threads of its own, so a worker forked
  from it inherits no GPU runtime state and no lock held by a busy thread of the trainer
  (the pin-memory thread, a decoding thread): the two things ``fork`` from the trainer gets
  wrong. CPython 3.14 made forkserver its Linux default for the same reason.
- a worker is a fork of that server: it starts in milliseconds, already has torch and
  Ultralytics imported, and reads its dataset at once, so workers start together. A dataset
  defined elsewhere has its module imported by the server too, once, before its next fork
  (:mod:`rocm_yolo.process.preimport`): not once in every worker.

The server records what it is in ``RUN/rocm_yolo/forkserver.json`` (threads, GPU device
files open) and dies with the trainer (``PR_SET_PDEATHSIG``); each worker dies with the
server and kills itself if the trainer is already gone (see patches/loaders/dataloader.WorkerInit).
This module does not import torch: it runs before the trainer imports it.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import os
import time

from rocm_yolo import environment
from rocm_yolo.process import preimport
from rocm_yolo.run.devices import rank
from rocm_yolo.run.paths import RunPaths

PRELOAD = "rocm_yolo.trainer.loaders.preload"  # the module the server imports (torch, Ultralytics' data modules)
SINGLE_THREADED = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # unless the user set them


def start(run_dir: str | os.PathLike) -> None:
    """Start the preloaded fork server now, so its imports overlap the trainer's set-up.

    Returns at once: the server imports in the background, and the first worker request
    waits for it. Call after the environment is final (the server and every worker inherit
    it) and before the first DataLoader with workers is iterated.
    """
    os.environ[environment.TRAINER_PID] = str(os.getpid())  # the server dies with it
    os.environ[environment.RUN_DIR] = str(run_dir)  # where the server records itself
    imports = RunPaths(run_dir).forkserver_imports(rank())  # the datasets' modules, imported once by the server
    try:
        imports.parent.mkdir(parents=True, exist_ok=True)
        imports.write_text("")
        preimport.reset()
        os.environ[environment.FORKSERVER_IMPORTS] = str(imports)
    except OSError:
        os.environ.pop(environment.FORKSERVER_IMPORTS, None)  # every worker then imports them itself
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOAD])
    # The server and its workers need no math thread pools (torch sets one thread per worker
    # anyway): the server then forks with no idle pool thread beside its main thread.
    saved = {key: os.environ.get(key) for key in SINGLE_THREADED}
    for key in SINGLE_THREADED:
        os.environ.setdefault(key, "1")
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
