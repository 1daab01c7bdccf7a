"""A DataLoader worker that dies is reported as torch reports it, also when it is not this process's child.

torch learns of a dead worker from ``SIGCHLD``: its handler raises "DataLoader worker (pid N) is
killed by signal: Killed." in the main thread, which ``_try_get_data`` turns into "DataLoader
worker (pid(s) N) exited unexpectedly" with that line as its cause. A worker forked from the
fork server is the server's child, not this process's: no ``SIGCHLD`` comes, and the loader only
noticed the death at its next 5-second status check, with a bare ``queue.Empty`` as the cause.

One patch on ``_MultiProcessingDataLoaderIter._try_get_data``, only for an iterator whose workers
are not children of this process: it waits for data in steps of :data:`POLL` seconds and, between
them, reads each worker's exit status (the fork server sends it down the worker's sentinel pipe,
so reading it costs a non-blocking ``poll``). A worker that exited with a signal or a non-zero
code raises torch's two errors, in torch's words; where torch's own status check saw the death
first, its error gets the line it lacks as its cause; and where the data queue broke as the worker
died handing over a batch (``ConnectionResetError``, ``EOFError``), the death the server reports a
moment later is named instead. Everything else (timeouts, a worker's own
exception, the pin-memory thread) is torch's unchanged. Idempotent; :func:`uninstall` restores
the original function object.

The other side of that hand-over: a worker passes a batch's shared memory as a file descriptor
from a thread of ``multiprocessing.resource_sharer``, which reports any error through
``sys.excepthook``. When the trainer goes while it takes a batch (a stop, Ctrl-C, a crash),
that thread printed ``BrokenPipeError`` (or ``EOFError``) with its traceback on the user's terminal, under the
supervisor's "stopped by SIGINT". :func:`quiet_handover_breaks`, run in each worker, drops that
one report: the trainer's side is what says what happened.
"""

from __future__ import annotations

import functools
import signal
import sys
import time
from pathlib import Path

from torch.utils.data import _utils
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from rocm_yolo.patches.swap import Swaps

POLL = 0.1  # seconds between two looks at the workers' exit status
REPORT_WAIT = 2.0  # a broken queue: how long the fork server may take to report the death that broke it

_swaps = Swaps()  # _MultiProcessingDataLoaderIter._try_get_data


def installed() -> bool:
    return _swaps.installed()


def install() -> None:
    _swaps.replace(_MultiProcessingDataLoaderIter, "_try_get_data", _watching)


def _watching(original):
    @functools.wraps(original)
    def _try_get_data(self, timeout=_utils.MP_STATUS_CHECK_INTERVAL):
        if not _foster_workers(self):
            return original(self, timeout)
        deadline = time.monotonic() + timeout
        while True:
            _raise_if_one_died(self)
            left = deadline - time.monotonic()
            try:
                success, data = original(self, max(0.0, min(POLL, left)))
            except RuntimeError as e:  # torch's own check saw the death first: its error, with the line it lacks
                _raise_with_cause(self, e)
                raise
            except (ConnectionError, EOFError):  # the queue broke as a worker died handing over a batch
                _raise_if_one_died(self, wait=REPORT_WAIT)
                raise
            if success or left <= POLL:
                return success, data

    return _try_get_data


def uninstall() -> None:
    _swaps.restore()


def _foster_workers(iterator) -> bool:
    """Whether the iterator's workers are someone else's children (the fork server's): no SIGCHLD tells of them."""
    cached = getattr(iterator, "_rocm_yolo_foster", None)
    if cached is None:
        workers = getattr(iterator, "_workers", None) or []
        popen = getattr(workers[0], "_popen", None) if workers else None
        cached = type(popen).__module__ == "multiprocessing.popen_forkserver"
        iterator._rocm_yolo_foster = cached
    return cached


def cause(pid: int, exitcode: int) -> str:
    """torch's line for a worker that died (its SIGCHLD handler's words, ``torch/csrc/DataLoader.cpp``)."""
    if exitcode < 0:
        try:
            name = signal.strsignal(-exitcode) or f"signal {-exitcode}"
        except ValueError:
            name = f"signal {-exitcode}"
        line = f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
        if -exitcode == signal.SIGBUS:
            line += (
                "It is possible that dataloader's workers are out of shared memory. "
                "Please try to raise your shared memory limit."
            )
        return line
    return (
        f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. Details are lost due to "
        "multiprocessing. Rerunning with num_workers=0 may give better error trace."
    )


def _raise_with_cause(iterator, error: RuntimeError) -> None:
    """Re-raise torch's "exited unexpectedly" ``error`` with the first dead worker's line as its cause."""
    if isinstance(error.__cause__, RuntimeError):
        return  # it has one
    for w in iterator._workers:
        code = w.exitcode
        if code not in (None, 0):
            raise RuntimeError(*error.args) from RuntimeError(cause(w.pid, code))


def _raise_if_one_died(iterator, wait: float = 0.0) -> None:
    """torch's errors for the first worker that exited with a signal or an error, looking for up to ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        for worker_id, w in enumerate(iterator._workers):
            if not iterator._workers_status[worker_id]:
                continue  # shut down on purpose (an iterable dataset's exhausted worker)
            code = w.exitcode  # a non-blocking look at the sentinel pipe
            if code is None or code == 0:
                continue
            iterator._mark_worker_as_unavailable(worker_id)
            raise RuntimeError(f"DataLoader worker (pid(s) {w.pid}) exited unexpectedly") from RuntimeError(
                cause(w.pid, code)
            )
        if time.monotonic() >= deadline:
            return
        time.sleep(0.02)


# the taker of a batch's descriptor went away: as it was sent, or before it asked (the hand-over's recv ends early)
HANDOVER_BREAKS = (BrokenPipeError, ConnectionResetError, EOFError)


def _from_resource_sharer(tb) -> bool:
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.name == "resource_sharer.py" and path.parent.name == "multiprocessing":
            return True
        tb = tb.tb_next
    return False


def quiet_handover_breaks() -> None:
    """In a DataLoader worker: ``sys.excepthook`` without the report of a descriptor hand-over that broke because
    its taker (the trainer) went away; every other report goes to the hook there was. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "rocm_yolo_quiet_handover", False):
        return

    def hook(kind, value, tb):
        if issubclass(kind, HANDOVER_BREAKS) and _from_resource_sharer(tb):
            return
        previous(kind, value, tb)

    hook.rocm_yolo_quiet_handover = True
    sys.excepthook = hook
