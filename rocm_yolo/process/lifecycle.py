"""How a process the supervisor starts lives and dies: the part of the process model both sides share.

- the trainer, the fork server and every DataLoader worker die with their parent, even when
  it is SIGKILLed (:func:`die_with_parent`, Linux ``PR_SET_PDEATHSIG``), so no orphan keeps
  the GPU;
- each of them registers faulthandler on :data:`DUMP_SIGNAL`, which the watchdog sends to
  dump their Python stacks, into a file of its own in the run's private ``stacks/`` (:func:`dump_stacks_into`);
- :data:`rocm_yolo.environment.SUPERVISOR_PID` names the supervisor to its descendants (py-spy may attach to them);
- a stop that arrives during a checkpoint's save waits for the save to end (:func:`uninterrupted`);
- a process that imported torch exits without collecting it (:func:`exit_uncollected`).

Torch-free and light (ctypes, psutil): the fork server's preload and every worker import it.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import os
import signal
import sys
from typing import Callable, Iterator, NoReturn

import psutil

from rocm_yolo import environment
from rocm_yolo.run.atomic import open_append, private_dirs

DUMP_SIGNAL = signal.SIGUSR1  # faulthandler is registered on it in the trainer and every worker
PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61  # Yama: let the supervisor's py-spy (its child) attach to the trainer


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    except OSError:
        return None


LIBC = _libc()  # loaded once here: a preexec_fn must not load libraries after fork


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 40`` for a real-time or unknown number (never raises)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_uncollected(main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())``, whose exit walks no object ``main`` left: its work is done and its files closed.

    The interpreter's exit collects every object still tracked, several times: torch's and
    Ultralytics' millions take 2 s of a 2-core machine's CPU in each process that imported
    them (the trainer, each rank, torch's launcher), while the supervisor waits for the end or
    the next attempt starts. Frozen (``gc.freeze``), the exit takes 0.5 s: atexit handlers
    (multiprocessing's stops the DataLoader workers, logging's flushes its files) and non-daemon
    threads (a checkpoint write) still run, and what is left goes with the process, as after a
    kill. Also when ``main`` ends by an exception (a stop: SIGTERM).
    """
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)


def pdeathsig_kill() -> None:
    """preexec_fn: the new process is SIGKILLed when the thread that started it dies."""
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent(parent_pid: int = 0) -> None:
    """In a child: be killed when the parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).

    The signal is SIGKILL, delivered by the kernel: a process stuck in native code (a GPU
    runtime deadlock) never runs a Python handler. ``parent_pid`` (if given) may also attach
    py-spy to this process under Yama's ptrace restrictions.
    """
    if LIBC is None:
        return
    try:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        tracer = int(os.environ.get(environment.SUPERVISOR_PID, "0") or 0) or parent_pid
        if tracer:  # fails harmlessly without Yama; faulthandler needs no ptrace anyway
            LIBC.prctl(PR_SET_PTRACER, tracer, 0, 0, 0)
    except (OSError, AttributeError, ValueError):
        return
    if parent_pid and os.getppid() != parent_pid:  # the parent died before the call above
        os.kill(os.getpid(), signal.SIGKILL)


def dump_stacks_into(paths, path):
    """Register faulthandler on :data:`DUMP_SIGNAL`: this process's stacks go into ``path``, a file of the run's
    ``stacks/`` folder (``paths``: the run's :class:`~rocm_yolo.run.paths.RunPaths`), made private and never opened
    through a link. The file stays open for the life of the process; returned."""
    private_dirs(paths.state, paths.node_dir, paths.stacks)
    handle = open_append(path)
    faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
    return handle


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live process (a zombie is not; nor is ``None`` or 0)."""
    if not pid:
        return False
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError, TypeError):
        return False


_critical = 0  # uninterrupted blocks in progress (on the main thread, where signal handlers run)
_deferred: list[Callable[[], None]] = []  # the stop that arrived inside one


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A stop that arrives inside this block (a handler that calls :func:`stop_or_defer`) is carried out when the
    block ends: a checkpoint's save completes, then the process stops."""
    global _critical
    _critical += 1
    try:
        yield
    finally:
        _critical -= 1
        if not _critical and _deferred:
            stop = _deferred[0]
            _deferred.clear()
            stop()


def stop_or_defer(stop: Callable[[], None]) -> None:
    """In a signal handler: ``stop()`` now, or when the :func:`uninterrupted` block in progress ends."""
    if _critical:
        if not _deferred:
            _deferred.append(stop)
        return
    stop()
