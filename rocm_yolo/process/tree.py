"""Process trees: start a child in its own session, dump its stacks, kill all of it.

The training child runs in a new session (and so a new process group); its DataLoader
workers, the multiprocessing resource tracker and anything else it starts stay in that
session even when orphaned. :func:`members` finds them through the process tree and the
session id, :func:`kill` sends SIGTERM, waits a bounded time, then SIGKILL, waits a bounded
time again, and returns whatever still lives (a process stuck in the kernel): it never
waits without a limit. :func:`run_bounded` is the one runner of throwaway helper commands
(doctor probes, the conv self-test): bounded in time, output captured, nothing left behind.
"""

from __future__ import annotations

import fcntl
import os
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
    """Stop the whole tree of ``pid``: SIGTERM, a bounded wait, SIGKILL for the rest.

    The leader (the trainer) gets SIGTERM first and up to half of ``term_timeout`` to shut
    its own workers down, so they are not killed under it (torch would report each one);
    then every process left gets SIGTERM, then SIGKILL. Returns the pids still alive
    afterwards (stuck in uninterruptible sleep); never blocks longer than ``term_timeout +
    kill_timeout`` plus a few psutil calls.
    """
    procs = members(pid)
    if not procs:
        return []
    deadline = time.monotonic() + term_timeout
    leader = [p for p in procs if p.pid == pid]
    if leader:
        send(leader, signal.SIGTERM)
        send(procs, signal.SIGCONT)  # a stopped tree (Ctrl-Z, SIGSTOP) wakes to find the stop, not to train on
        psutil.wait_procs(leader, timeout=term_timeout / 2)
    alive = {p.pid: p for p in procs + members(pid) if _running(p)}
    send(list(alive.values()), signal.SIGTERM)
    send(list(alive.values()), signal.SIGCONT)
    _, still = psutil.wait_procs(list(alive.values()), timeout=max(0.0, deadline - time.monotonic()))
    still += [p for p in members(pid) if p.pid not in {a.pid for a in still} and _running(p)]
    if still:
        send(still, signal.SIGKILL)
        _, still = psutil.wait_procs(still, timeout=kill_timeout)
    return [p.pid for p in still]


# the write system calls by machine (asm/unistd of x86_64 and of the generic table aarch64 uses)
_WRITES = {"x86_64": {1, 20}, "aarch64": {64, 66}}


def blocked_on_terminal(pid: int) -> int | None:
    """The pid of a process of ``pid``'s tree whose main thread waits in a write to a terminal (a paused
    terminal: Ctrl-S), or None. Read from ``/proc/PID/syscall`` (the call and its first argument, the fd) and
    the fd's target; where that cannot be read, from ``/proc/PID/wchan``."""
    writes = _WRITES.get(os.uname().machine, set())
    for proc in members(pid):
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


def dump_stacks(
    pid: int,
    stacks_dir: Path,
    out: Path,
    roles: dict[int, str] | None = None,
    wait: float = 2.0,
    py_spy_timeout: float = 10.0,
) -> Path:
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
    out.write_text("\n".join(parts) + "\n")
    return out


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


def start_captured(cmd: Sequence[str], env: dict | None = None) -> tuple[subprocess.Popen, object, object]:
    """Start ``cmd`` in its own session (process group), output to temporary files."""
    out, err = tempfile.TemporaryFile(mode="w+b"), tempfile.TemporaryFile(mode="w+b")
    for handle in (out, err):  # appends: the child's writes never land where our reads seek
        fcntl.fcntl(handle.fileno(), fcntl.F_SETFL, fcntl.fcntl(handle.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    proc = start(list(cmd), env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)  # dies with the doctor
    return proc, out, err


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
            try:
                proc.wait(timeout=max(0.0, min(left, poll) if rebase is not None else left))
                break
            except subprocess.TimeoutExpired:
                pass
            if rebase is not None:
                allowance = rebase(read_file(out))
                if allowance is not None:
                    deadline, rebase = time.monotonic() + allowance, None
            if time.monotonic() >= deadline:
                timed_out = True
                break
    finally:
        kill_now(proc)  # also reaps anything a finished command left in its group
    result = Outcome(
        None if timed_out else proc.returncode, read_file(out), read_file(err), time.monotonic() - began, timed_out
    )
    out.close()
    err.close()
    return result
