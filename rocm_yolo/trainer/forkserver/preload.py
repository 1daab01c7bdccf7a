"""Imported by the fork server (see :mod:`.server`) once, before it forks any worker.

It ties the server's life to the trainer's, imports what a DataLoader worker needs to
unpickle an Ultralytics dataset and run it, and records the server's state: how many
threads it has and whether it holds any GPU device file (it must hold none).
"""

from __future__ import annotations

import json
import os
import time

from rocm_yolo import environment
from rocm_yolo.process.lifecycle import die_with_parent
from rocm_yolo.run.atomic import private_dirs, write_atomic
from rocm_yolo.run.devices import rank
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.trainer.forkserver import preimport, server


def _import_worker_modules() -> tuple[str | None, str | None]:
    """Import :data:`.server.WORKER_MODULES` (torch, Ultralytics' data modules, the worker side of the DataLoader
    patch): in a server forked from the trainer they are imported already.

    Returns (Ultralytics' version, None), or (None, the error in one line): a broken torch is
    reported by the trainer's own checked import, as a setup error; multiprocessing's server
    would print a traceback for anything but an ImportError. Without the preload the server
    still forks, as a plain fork server.
    """
    error = server.import_worker_modules()
    if error:
        return None, error
    import ultralytics

    return ultralytics.__version__, None


def _preload() -> None:
    trainer = int(os.environ.get(environment.TRAINER_PID, "0") or 0)
    die_with_parent(trainer)  # the server dies with the trainer, even if it is SIGKILLed
    began = time.monotonic()
    version, error = _import_worker_modules()

    import threading

    run_dir = os.environ.get(environment.RUN_DIR)
    if run_dir:
        record = {
            "pid": os.getpid(),
            "trainer": trainer,
            "started": "fork" if server.FORKED else "exec",  # forked from the trainer, or a new interpreter
            "import_seconds": round(time.monotonic() - began, 2),
            "ultralytics": version,  # what the workers run (the lower-bound tests check it)
            "python_threads": threading.active_count(),
            "native_threads": preimport.native_threads(),
            "gpu_files": preimport.gpu_files(),
            "time": time.time(),
            "preload_error": error,
        }
        try:
            paths = RunPaths(run_dir)
            private_dirs(paths.state, paths.node_dir)
            write_atomic(paths.forkserver(rank()), json.dumps(record))  # each rank's server its own; never via a link
        except (OSError, ValueError):  # ValueError: rocm_yolo.errors.UsageError, a folder not the user's
            pass


def _import_before_fork() -> None:
    """Import the modules the next workers will need (:mod:`.preimport`) before each fork.

    multiprocessing's server loop calls ``os.fork()`` for each worker it is asked for; in this
    process only, that name imports the new wanted modules first, so each worker inherits them.
    """
    fork = os.fork
    if getattr(fork, "__rocm_yolo_patch__", False) or preimport.source() is None:
        return

    def fork_after_imports() -> int:
        preimport.import_wanted()
        return fork()

    fork_after_imports.__rocm_yolo_patch__ = True
    os.fork = fork_after_imports


_preload()
_import_before_fork()
