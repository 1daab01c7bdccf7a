"""Process trees: start a child in its own session, dump its stacks, kill all of it.

The training child runs in a new session (and so a new process group); its DataLoader
workers, the multiprocessing resource tracker and anything else it starts stay in that
session even when orphaned. :func:`members` finds them through the process tree and the
session id, :func:`kill` sends SIGTERM, waits a bounded time, then SIGKILL, waits a bounded
time again, and returns whatever still lives (a process stuck in the kernel): it never
waits without a limit.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

DUMP_SIGNAL = signal.SIGUSR1  # faulthandler is registered on it in the trainer and every worker
PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61  # Yama: let the supervisor's py-spy (its child) attach to the trainer


def die_with_parent(parent_pid: int = 0) -> None:
    """In a child: be killed when the parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).

    The signal is SIGKILL, delivered by the kernel: a process stuck in native code (a GPU
    runtime deadlock) never runs a Python handler. ``parent_pid`` (if given) may also attach
    py-spy to this process under Yama's ptrace restrictions.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if parent_pid:  # fails harmlessly without Yama; faulthandler needs no ptrace anyway
            libc.prctl(PR_SET_PTRACER, parent_pid, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent_pid and os.getppid() != parent_pid:  # the parent died before the call above
        os.kill(os.getpid(), signal.SIGKILL)


def start(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in a new session; stdout and stderr stay the terminal's."""
    return subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)


def members(pid: int) -> list[psutil.Process]:
    """``pid``, its descendants, and every process of its session (orphans included)."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        found[pid] = root
        for child in root.children(recursive=True):
            found[child.pid] = child
    except psutil.Error:
        pass
    try:
        sid = os.getsid(pid)
    except OSError:
        sid = pid  # the leader is gone: its session id was its pid
    if sid != os.getsid(0):  # never sweep our own session
        for proc in psutil.process_iter():
            try:
                if proc.pid not in found and os.getsid(proc.pid) == sid:
                    found[proc.pid] = proc
            except (OSError, psutil.Error):
                continue
    return list(found.values())


def with_env(var: str, value: str) -> list[psutil.Process]:
    """Processes (of this user) whose environment has ``var=value``: a tag every descendant inherits."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(var) == value:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def send(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def kill(pid: int, term_timeout: float = 8.0, kill_timeout: float = 4.0) -> list[int]:
    """SIGTERM the whole tree of ``pid``, wait up to ``term_timeout``, SIGKILL the rest.

    Returns the pids still alive afterwards (stuck in uninterruptible sleep), never blocks
    longer than ``term_timeout + kill_timeout`` plus a few psutil calls.
    """
    procs = members(pid)
    if not procs:
        return []
    send(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=term_timeout)
    alive += [p for p in members(pid) if p.pid not in {a.pid for a in alive} and p.is_running()]
    if alive:
        send(alive, signal.SIGKILL)
        _, alive = psutil.wait_procs(alive, timeout=kill_timeout)
    return [p.pid for p in alive]


def kill_now(proc: subprocess.Popen, timeout: float = 5.0) -> list[int]:
    """SIGKILL a child made by :func:`start` and its whole session at once, and reap it.

    For throwaway helper processes (self-tests, doctor probes): no grace period. Returns the
    pids still alive after ``timeout``.
    """
    procs = members(proc.pid)
    send(procs, signal.SIGKILL)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    return [p.pid for p in alive]


def dump_stacks(pid: int, stacks_dir: Path, out: Path, roles: dict[int, str] | None = None,
                wait: float = 2.0, py_spy_timeout: float = 10.0) -> Path:
    """Write the Python stacks of every process in the tree into ``out``; bounded in time.

    Sends :data:`DUMP_SIGNAL` (faulthandler writes from C, even while Python is deadlocked),
    reads what each process wrote into ``stacks_dir``, and adds ``py-spy dump --native`` where
    py-spy is installed and permitted.
    """
    roles = dict(roles or {})
    procs = members(pid)
    sizes = {f: f.stat().st_size for f in stacks_dir.glob("*.txt")} if stacks_dir.is_dir() else {}
    # The trainer first: a worker killed by the signal must not make the trainer unwind before it dumped.
    trainer = [p for p in procs if p.pid == pid]
    send(trainer, DUMP_SIGNAL)
    time.sleep(wait / 2)
    send([p for p in procs if p.pid != pid and _has_stack_file(stacks_dir, p.pid)], DUMP_SIGNAL)
    time.sleep(wait / 2)
    py_spy = find_py_spy()
    deadline = time.monotonic() + py_spy_timeout  # one budget for all py-spy calls
    parts: list[str] = []
    for proc in procs:
        role = "trainer" if proc.pid == pid else roles.get(proc.pid, "worker" if _has_stack_file(stacks_dir, proc.pid) else "other")
        try:
            cmdline = " ".join(proc.cmdline())[:300]
            status = proc.status()
        except psutil.Error:
            cmdline, status = "?", "gone"
        parts.append(f"===== pid {proc.pid} ({role}, {status}): {cmdline}")
        for f in (stacks_dir / f"trainer-{proc.pid}.txt", stacks_dir / f"worker-{proc.pid}.txt"):
            if f.is_file():
                with open(f, "rb") as fh:
                    fh.seek(sizes.get(f, 0))
                    text = fh.read().decode("utf-8", "replace").strip()
                parts.append(text or "(no Python stack written: the process did not answer the signal)")
        if py_spy:
            remaining = deadline - time.monotonic()
            parts.append(_py_spy(py_spy, proc.pid, remaining) if remaining > 0.5 else "--- py-spy: time budget used")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n")
    return out


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a virtual environment that is not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def _has_stack_file(stacks_dir: Path, pid: int) -> bool:
    return (stacks_dir / f"worker-{pid}.txt").is_file() or (stacks_dir / f"trainer-{pid}.txt").is_file()


def _py_spy(exe: str, pid: int, timeout: float) -> str:
    try:
        proc = subprocess.run([exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"--- py-spy: no answer within {timeout:g} s"
    except OSError as e:
        return f"--- py-spy: {e}"
    text = (proc.stdout or proc.stderr).strip()
    return f"--- py-spy dump --native (exit {proc.returncode}):\n{text}"
