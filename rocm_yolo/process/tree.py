"""Process trees: start a child in its own session, dump its stacks, kill all of it.

The training child runs in a new session (and so a new process group); its DataLoader
workers, the multiprocessing resource tracker and anything else it starts stay in that
session even when orphaned. :func:`members` finds them through the process tree and the
session id, :func:`kill` sends SIGTERM, waits a bounded time, then SIGKILL, waits a bounded
time again, and returns whatever still lives (a process stuck in the kernel): it never
waits without a limit.

A child's pid (and its session id, the same number) is its own only until the child is reaped: then the
kernel may give the number to any new process, and an unrelated tree of the same user would get the signals.
So a :class:`Tree` (what :func:`kill` and :func:`kill_now` take) holds its child unreaped: it learns of an exit
without reaping (``waitid`` with ``WNOWAIT``: the zombie keeps the number), signals the child itself through a
pidfd taken at the start (``pidfd_send_signal``), and reaps only at the end of a kill, after the last look at
the session. From then on it signals only the processes it saw before the reap that still run (psutil checks a
process's start time before each signal), and never looks the number up again.

:func:`run_bounded` is the one runner of throwaway helper commands (doctor probes, the conv self-test): bounded in
time, output captured, nothing left behind. :func:`python` is the command line of every interpreter rocm-yolo starts.
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import psutil

from rocm_yolo.process.lifecycle import DUMP_SIGNAL, pdeathsig_kill, signal_name
from rocm_yolo.run.atomic import write_report

SAFE_PATH = "PYTHONSAFEPATH"  # -P for an interpreter started by another program (torch's launcher starts the ranks)


def python(*args: str, executable: str | None = None) -> list[str]:
    """The command line of a new interpreter rocm-yolo starts (the trainer, the DDP launcher, a probe): ``-P``, so
    that neither the working directory (``-m``, ``-c``) nor a script's folder is on its ``sys.path``: a ``psutil.py``
    someone left in the folder the user trains from (a shared data set, /tmp) is never imported. ``PYTHONPATH`` still
    counts, and every interpreter started by this one with its flags (multiprocessing's) has ``-P`` too."""
    return [executable or sys.executable, "-P", *args]


def start(cmd: list[str], env: dict | None = None, cwd: str | None = None, *, pass_fds=(), **popen) -> subprocess.Popen:
    """Start ``cmd`` in a new session that dies with this process (even if it is SIGKILLed).

    The kernel sends SIGKILL to the new process when the thread that started it exits
    (``PR_SET_PDEATHSIG``, set between fork and exec): no orphan keeps the GPU. stdout and
    stderr stay the caller's unless ``popen`` says otherwise.
    """
    return subprocess.Popen(
        cmd, env=env, cwd=cwd, start_new_session=True, pass_fds=pass_fds, preexec_fn=pdeathsig_kill, **popen
    )


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


class Tree:
    """A child made by :func:`start` (a session of its own) and the processes of its session, never confused with
    what may get its number after it is reaped (see above)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.pid = proc, proc.pid
        try:
            self.pidfd: int | None = os.pidfd_open(proc.pid)  # Linux 5.3: signals reach this child and no other
        except (AttributeError, OSError):
            self.pidfd = None
        self.seen: dict[int, psutil.Process] = {}  # every process of the tree seen while the child was not reaped
        self.reaped = False

    def exited(self) -> int | None:
        """Its exit code once it has exited (as ``Popen.returncode``), without reaping it."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else: the Popen knows its code
            return self.proc.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the child to exit, without reaping it; its exit code, or None."""
        deadline = time.monotonic() + timeout
        while (code := self.exited()) is None and (left := deadline - time.monotonic()) > 0:
            if self.pidfd is not None:
                select.select([self.pidfd], [], [], left)  # readable once the child has exited
            else:
                time.sleep(min(left, 0.05))
        return code

    def members(self) -> list[psutil.Process]:
        """Its processes now: by pid and session id while the child is not reaped (a zombie's number is still its
        own); once reaped, only those seen before that still run."""
        if not self.reaped:
            found = members(self.pid)
            self.seen.update((p.pid, p) for p in found)
            return found
        return [p for p in self.seen.values() if _running(p)]

    def signal_child(self, sig: int) -> None:
        """``sig`` to the child itself (through its pidfd), never to a process that took its number."""
        if self.reaped:
            return
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            elif self.exited() is None:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self, timeout: float = 1.0) -> int | None:
        """Reap the child once it has exited (within ``timeout``), after the last look at its session; its exit code
        (None: it still runs)."""
        if not self.reaped:
            self.members()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
            self.reaped = True
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None
        return self.proc.returncode


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


def kill(tree: Tree, term_timeout: float = 8.0, kill_timeout: float = 4.0) -> list[int]:
    """Stop the whole ``tree``: SIGTERM, a bounded wait, SIGKILL for the rest; then reap its child.

    The leader (the trainer) gets SIGTERM first and up to half of ``term_timeout`` to shut
    its own workers down, so they are not killed under it (torch would report each one);
    then every process left gets SIGTERM, then SIGKILL. Returns the pids still alive
    afterwards (stuck in uninterruptible sleep); never blocks longer than ``term_timeout +
    kill_timeout`` plus a few psutil calls.
    """
    procs = tree.members()
    deadline = time.monotonic() + term_timeout
    if any(p.pid == tree.pid for p in procs) and tree.exited() is None:
        tree.signal_child(signal.SIGTERM)
        send(procs, signal.SIGCONT)  # a stopped tree (Ctrl-Z, SIGSTOP) wakes to find the stop, not to train on
        _wait_gone([p for p in procs if p.pid == tree.pid], term_timeout / 2)
    alive = {p.pid: p for p in procs + tree.members() if _running(p)}
    send(list(alive.values()), signal.SIGTERM)
    send(list(alive.values()), signal.SIGCONT)
    still = _wait_gone(list(alive.values()), max(0.0, deadline - time.monotonic()))
    still += [p for p in tree.members() if p.pid not in {a.pid for a in still} and _running(p)]
    if still:
        send(still, signal.SIGKILL)
        still = _wait_gone(still, kill_timeout)
    tree.reap()
    return [p.pid for p in still]


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` seconds until none of ``procs`` runs (a zombie does not); the ones that still do. Reaps
    nothing (psutil's own wait reaps a child of this process: its number would be free again)."""
    deadline = time.monotonic() + timeout
    still = [p for p in procs if _running(p)]
    while still and time.monotonic() < deadline:
        time.sleep(0.05)
        still = [p for p in still if _running(p)]
    return still


# the write system calls by machine (asm/unistd of x86_64 and of the generic table aarch64 uses)
_WRITES = {"x86_64": {1, 20}, "aarch64": {64, 66}}


def blocked_on_terminal(procs: list[psutil.Process]) -> int | None:
    """The pid of a process of ``procs`` (a tree's) whose main thread waits in a write to a terminal (a paused
    terminal: Ctrl-S), or None. Read from ``/proc/PID/syscall`` (the call and its first argument, the fd) and
    the fd's target; where that cannot be read, from ``/proc/PID/wchan``."""
    writes = _WRITES.get(os.uname().machine, set())
    for proc in procs:
        try:
            call = Path(f"/proc/{proc.pid}/syscall").read_text().split()
            if call and call[0].isdigit() and int(call[0]) in writes:
                target = os.readlink(f"/proc/{proc.pid}/fd/{int(call[1], 16)}")
                if target.startswith(("/dev/pts/", "/dev/tty")):
                    return proc.pid
                continue
            if not call and "tty_write" in Path(f"/proc/{proc.pid}/wchan").read_text():
                return proc.pid
        except (OSError, ValueError, IndexError):
            continue
    return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_now(tree: Tree, timeout: float = 5.0) -> list[int]:
    """SIGKILL a child made by :func:`start` and its whole session at once, and reap it.

    For throwaway helper processes (self-tests, doctor probes, notify commands): no grace period. Returns the
    pids still alive after ``timeout``.
    """
    procs = tree.members()
    tree.signal_child(signal.SIGKILL)
    send(procs, signal.SIGKILL)
    alive = _wait_gone(procs, timeout)
    tree.reap(timeout)
    return [p.pid for p in alive]


def dump_stacks(
    pid: int,
    stacks_dir: Path,
    out: Path,
    roles: dict[int, str] | None = None,
    wait: float = 2.0,
    py_spy_timeout: float = 10.0,
    procs: list[psutil.Process] | None = None,
) -> Path:
    """Write the Python stacks of every process in the tree into ``out``; bounded in time.

    Sends :data:`DUMP_SIGNAL` (faulthandler writes from C, even while Python is deadlocked),
    reads what each process wrote into ``stacks_dir``, and adds ``py-spy dump --native`` where
    py-spy is installed and permitted. ``procs``: the tree's processes (a :class:`Tree`'s ``members()``), else found
    from ``pid``. The report is 0640, never written through a link, and cut to its last 10 MiB.
    """
    roles = dict(roles or {})
    procs = members(pid) if procs is None else procs
    sizes = {f: f.stat().st_size for f in stacks_dir.glob("*.txt")} if stacks_dir.is_dir() else {}
    # The trainer first: a worker killed by the signal must not make the trainer unwind before it dumped.
    trainer = [p for p in procs if p.pid == pid]
    send(trainer, DUMP_SIGNAL)
    time.sleep(wait / 2)
    send([p for p in procs if p.pid != pid and _has_stack_file(stacks_dir, p.pid)], DUMP_SIGNAL)
    time.sleep(wait / 2)
    native = _py_spy_all(find_py_spy(), [p.pid for p in procs], py_spy_timeout)
    parts: list[str] = []
    for proc in procs:
        role = "trainer" if proc.pid == pid else roles.get(proc.pid, role_of(stacks_dir, proc.pid))
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
        if proc.pid in native:
            parts.append(native[proc.pid])
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_report(out, "\n".join(parts) + "\n")


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a virtual environment that is not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def role_of(stacks_dir: Path, pid: int) -> str:
    """A process below the trainer: a DDP rank (a trainer of its own), a DataLoader worker, or other."""
    if (stacks_dir / f"trainer-{pid}.txt").is_file():
        return "rank"
    return "worker" if (stacks_dir / f"worker-{pid}.txt").is_file() else "other"


def _has_stack_file(stacks_dir: Path, pid: int) -> bool:
    return (stacks_dir / f"worker-{pid}.txt").is_file() or (stacks_dir / f"trainer-{pid}.txt").is_file()


PY_SPY_AT_ONCE = 8  # py-spy dumps running together (each pauses only the process it reads)


def _py_spy_all(exe: str | None, pids: list[int], budget: float) -> dict[int, str]:
    """``py-spy dump --native`` of each of ``pids``, side by side, all within one ``budget`` of seconds: a tree
    of 16 DataLoader workers is read in the time of two or three dumps, and every process gets its turn."""
    if not exe or not pids:
        return {}
    deadline = time.monotonic() + budget
    with ThreadPoolExecutor(max_workers=min(len(pids), PY_SPY_AT_ONCE)) as pool:
        done = {pid: pool.submit(lambda pid=pid: _py_spy(exe, pid, deadline - time.monotonic())) for pid in pids}
        return {pid: future.result() for pid, future in done.items()}


def _py_spy(exe: str, pid: int, timeout: float) -> str:
    if timeout <= 0.5:
        return "--- py-spy: time budget used"
    try:
        proc = subprocess.run(
            [exe, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"--- py-spy: no answer within {timeout:g} s"
    except OSError as e:
        return f"--- py-spy: {e}"
    text = (proc.stdout or proc.stderr).strip()
    return f"--- py-spy dump --native (exit {proc.returncode}):\n{text}"


# --------------------------------------------------------------------------- bounded helpers


@dataclass
class Outcome:
    returncode: int | None  # None: killed on timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            return signal_name(-self.returncode)
        return None

    def tail(self, n: int = 3) -> list[str]:
        lines = [x.rstrip() for x in self.stderr.splitlines() if x.strip()]
        return lines[-n:]


def start_captured(cmd: Sequence[str], env: dict | None = None) -> tuple[Tree, object, object]:
    """Start ``cmd`` in its own session (process group), output to temporary files."""
    out, err = tempfile.TemporaryFile(mode="w+b"), tempfile.TemporaryFile(mode="w+b")
    for handle in (out, err):  # appends: the child's writes never land where our reads seek
        fcntl.fcntl(handle.fileno(), fcntl.F_SETFL, fcntl.fcntl(handle.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    proc = start(list(cmd), env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)  # dies with the doctor
    return Tree(proc), out, err


def read_file(handle) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")


def run_bounded(
    cmd: Sequence[str],
    timeout: float,
    env: dict | None = None,
    *,
    rebase: Callable[[str], float | None] | None = None,
    poll: float = 0.25,
) -> Outcome:
    """Run ``cmd`` to completion or for ``timeout`` seconds, whichever is first; never leaves a process.

    ``rebase`` (polled with the output so far while the command runs) may return a number of
    seconds once: the command's own clock then starts again with that allowance (the doctor's
    loader probe gives a slow data set scan more time than the loading that follows it).
    """
    began = time.monotonic()
    deadline = began + timeout
    proc, out, err = start_captured(cmd, env)
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if proc.wait(max(0.0, min(left, poll) if rebase is not None else left)) is not None:
                break  # not reaped: the session is swept below while its number is its own
            if rebase is not None:
                allowance = rebase(read_file(out))
                if allowance is not None:
                    deadline, rebase = time.monotonic() + allowance, None
            if time.monotonic() >= deadline:
                timed_out = True
                break
    finally:
        kill_now(proc)  # also kills anything a finished command left in its session, then reaps it
    result = Outcome(
        None if timed_out else proc.proc.returncode, read_file(out), read_file(err), time.monotonic() - began, timed_out
    )
    out.close()
    err.close()
    return result
