"""Modules a fork server imports once, before it forks, instead of every worker importing them.

A worker forked from a fork server unpickles its dataset, and unpickling imports the module that
defines the dataset's class (and its ``worker_init_fn`` and ``collate_fn``) if the server had not
imported it: a module with heavy imports then costs its import time in every worker of every
loader (torch's ``test_iterable_style_dataset`` took 31 s instead of 1 s). The server's preload
list is fixed when it starts, so the loader's side names the modules its workers will need, over a pipe
from the trainer to its server (never a file: what a file says, whoever could write it would have every
worker import), and the server imports the new names before its next fork:

- :func:`channel` (the trainer, before it starts its server): the pipe; its read end's number goes to the
  server in :data:`rocm_yolo.environment.FORKSERVER_IMPORTS` (the server inherits that descriptor);
- :func:`want` (the process that builds loaders): write module names into the pipe, one JSON line each
  with the ``sys.path`` to import it from, never blocking (what the pipe does not take now goes with the
  next call); a name already sent is not sent again;
- :func:`import_wanted` (the fork server, before each fork): import the names that came since it last
  looked. A module that fails to import is skipped: the worker then imports it itself and
  reports its error as it would have.

The server must stay free of GPU state and threads (that is what its workers must not inherit):
a module is imported there only if a trial import in a fork of the server opened no GPU device
file and started no thread; the main script, whose top-level code may do either, never is.
multiprocessing then imports those in each worker, as without rocm-yolo. Light and torch-free:
the server runs it before it imports anything.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Iterable

from rocm_yolo import environment

_fork = os.fork  # the real one: the fork server's os.fork calls import_wanted first (trainer/forkserver/preload)
_written: set[str] = set()  # the loader's side: names already sent
_pipe: list = [None, b""]  # the loader's side: the write end, and what it has not taken yet
_received = b""  # the server's side: the beginning of a line whose end has not come yet


def channel() -> int:
    """The trainer, before it starts its fork server: a new pipe for the names (every name is asked for again);
    returns its read end, which the server inherits (its number in :data:`rocm_yolo.environment.FORKSERVER_IMPORTS`).
    Neither end is inherited by anything else the trainer starts (``O_CLOEXEC``); neither blocks."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    if _pipe[0] is not None:
        _close(_pipe[0])
    _pipe[:] = [write_end, b""]
    _written.clear()
    return read_end


def close() -> None:
    """No fork server reads the names any more (it could not be started): nothing is sent."""
    if _pipe[0] is not None:
        _close(_pipe[0])
    _pipe[:] = [None, b""]


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def source() -> int | None:
    """The fork server: the read end of the pipe its trainer writes the wanted modules into, if there is one."""
    value = os.environ.get(environment.FORKSERVER_IMPORTS, "")
    try:
        return int(value) if value.isdigit() and stat.S_ISFIFO(os.fstat(int(value)).st_mode) else None
    except OSError:  # a server started without it (a new one multiprocessing made): no names come
        return None


def want(names: Iterable[str]) -> list[str]:
    """Ask the fork server to import ``names`` before its next fork; returns the names newly asked for.

    Each line is a JSON object: the module and this process's ``sys.path``, which the server takes
    before it imports, as each worker takes it when it starts (the server's own is the one it started with).
    """
    if _pipe[0] is None:
        return []
    new = [n for n in dict.fromkeys(names) if n and n not in _written and _needed(n)]
    lines = [json.dumps({"module": n, "sys_path": sys.path}) for n in new]
    _pipe[1] += "".join(line + "\n" for line in lines).encode()
    _send()
    _written.update(new)
    return new


def _send() -> None:
    """Write what the pipe takes now; the rest waits for the next call (the server reads before each fork)."""
    try:
        while _pipe[1]:
            _pipe[1] = _pipe[1][os.write(_pipe[0], _pipe[1]) :]
    except BlockingIOError:
        pass
    except OSError:  # the server is gone: its workers import what they need themselves
        _pipe[1] = b""


def _needed(name: str) -> bool:
    """Not the main script (see above), not a built-in, not rocm-yolo's own (the preload's business)."""
    return name != "__main__" and name not in sys.builtin_module_names and not name.startswith("rocm_yolo.")


def import_wanted() -> list[str]:
    """In the fork server: import the modules its trainer sent since the last call; returns them."""
    global _received
    fd = source()
    if fd is None:
        return []
    data = _received
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except OSError:  # nothing more now (EAGAIN), or no such pipe
        pass
    cut = data.rfind(b"\n") + 1  # a line still being written is read next time
    complete, _received = data[:cut], data[cut:]
    done = []
    for line in complete.decode("utf-8", "replace").splitlines():
        try:
            wanted = json.loads(line)
            for entry in wanted.get("sys_path") or ():
                if entry not in sys.path:
                    sys.path.append(entry)
            if wanted["module"] not in sys.modules and _clean_import(wanted["module"]):
                __import__(wanted["module"])
                done.append(wanted["module"])
        except BaseException:  # noqa: BLE001 - the worker imports it itself and reports its error
            continue
    return done


GPU_DEVICES = ("/dev/kfd", "/dev/dri/", "/dev/nvidia")  # a process holding one of these has GPU runtime state


def gpu_files() -> list[str]:
    """The GPU device files this process holds open (a fork server must hold none)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(GPU_DEVICES):
            found.append(target)
    return found


def native_threads() -> list[str]:
    """The names of this process's threads, native ones too (a fork server must have its main thread alone)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names


def unfit_for_server() -> str | None:
    """Why this process is not as a fork server must be (None: it is): its main thread alone, no GPU file open."""
    threads = native_threads()
    if len(threads) > 1:
        return f"{len(threads)} threads ({', '.join(sorted(set(threads)))})"
    files = gpu_files()
    if files:
        return f"{files[0]} open"
    return None


def _clean_import(name: str) -> bool:
    """Whether importing ``name`` leaves a process as a fork server must stay: no GPU file open, no new thread.

    Tried first in a fork of this process, which then exits: a module that touches the GPU or
    starts a thread when imported is left to each worker to import, as without rocm-yolo.
    """
    pid = _fork()
    if pid == 0:  # the probe: nothing of it reaches the server but its exit status
        code = 1
        try:
            __import__(name)
            code = 0 if unfit_for_server() is None else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
