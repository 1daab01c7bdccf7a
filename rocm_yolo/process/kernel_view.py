"""What the kernel says of a process tree, read from ``/proc``: where each thread waits, and whether the tree moves.

- :func:`threads`: each thread's state (``/proc/PID/task/TID/stat``), the kernel function it sleeps in
  (``wchan``), the system call it is in (``syscall``: its number and arguments) and, for a call on a file
  descriptor (``ioctl``, ``read``, ...), the file it names (``/proc/PID/fd/N``). A thread in an ``ioctl`` on
  ``/dev/kfd`` waits for the GPU (libhsakmt's ``hsaKmtWaitOnEvent`` is ``AMDKFD_IOC_WAIT_EVENTS``), one in a
  ``futex`` waits for another thread or process (a queue's lock or condition).
- :func:`movement`: each process's state, CPU time (``stat``'s utime and stime) and I/O bytes (``io``'s rchar and
  wchar: reads and writes of files, pipes and sockets): a start-up that reads, computes or writes moves; one stopped
  or stuck in the kernel does not.

The files are Linux's (Documentation/filesystems/proc.rst); ``syscall`` and ``io`` need the right to trace the
process, which the supervisor has over its own tree. Whatever cannot be read is left empty, never guessed. The root
is ``/proc`` unless a caller names another (tests: a fake tree, ``WatchdogConfig.proc_root``). Torch-free and pure
but for the reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = "/proc"
MAX_THREADS = 64  # per process: a trainer has dozens (torch's, the HIP runtime's); the main thread comes first

# System call numbers (Linux arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h for aarch64)
SYSCALLS = {
    "x86_64": {
        0: "read", 1: "write", 7: "poll", 16: "ioctl", 17: "pread64", 19: "readv", 23: "select", 35: "nanosleep",
        42: "connect", 43: "accept", 45: "recvfrom", 47: "recvmsg", 61: "wait4", 202: "futex", 230: "clock_nanosleep",
        232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 425: "io_uring_enter",
    },
    "aarch64": {
        22: "epoll_pwait", 29: "ioctl", 63: "read", 64: "write", 65: "readv", 67: "pread64", 72: "pselect6",
        73: "ppoll", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 202: "accept", 203: "connect",
        207: "recvfrom", 212: "recvmsg", 242: "accept4", 260: "wait4", 426: "io_uring_enter",
    },
}  # fmt: skip
_ON_FILE = {"ioctl", "read", "write", "pread64", "readv"}  # calls whose first argument is a file descriptor
# the files of the GPU drivers: the KFD (ROCm's compute), amdgpu's DRM nodes, NVIDIA's devices
GPU_DEVICES = ("/dev/kfd", "/dev/dri/", "/dev/nvidia")
# the kernel functions of the GPU drivers a thread sleeps in (amdkfd's kfd_wait_on_events, amdgpu_*, nvidia's)
GPU_WCHAN = ("kfd_", "amdgpu_", "amdkfd_", "nvidia", "nv_", "uvm_", "os_wait")
STOPPED = ("T", "t")  # stat's states: stopped by a signal, stopped by a tracer


@dataclass(frozen=True)
class ThreadView:
    """One thread, as the kernel shows it."""

    pid: int
    tid: int
    role: str  # trainer, rank, worker, other
    state: str  # stat's: R running, S sleeping, D uninterruptible (disk, NFS, a driver), T stopped, Z zombie
    wchan: str = ""  # the kernel function it sleeps in ("" when running, or unreadable)
    syscall: str = ""  # the system call it is in ("running", "none", "" unreadable)
    fd: str = ""  # a call on a file descriptor: the file ("/dev/kfd", "pipe:[123]")

    @property
    def main(self) -> bool:
        return self.tid == self.pid

    @property
    def on_gpu(self) -> bool:
        """Waiting in a GPU driver: an ioctl on its device, or asleep in one of its functions."""
        return (self.syscall == "ioctl" and self.fd.startswith(GPU_DEVICES)) or self.wchan.startswith(GPU_WCHAN)

    def line(self) -> str:
        where = f"in {self.syscall}" + (f" on {self.fd}" if self.fd else "") if self.syscall else "system call unknown"
        return (
            f"{self.role} pid {self.pid}{'' if self.main else f' thread {self.tid}'}: state {self.state}, {where}, "
            f"wchan {self.wchan or '?'}"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _stat_fields(text: str) -> list[str]:
    """``stat``'s fields after the command name (which may hold spaces and parentheses): [state, ppid, ...]."""
    return text[text.rfind(")") + 2 :].split() if ")" in text else []


def _syscall(task: Path, proc: Path, machine: str) -> tuple[str, str]:
    """(the call's name, the file of its descriptor) from ``task/syscall``: "NR arg0 ...", "running" or "-1 ..."."""
    parts = _read(task / "syscall").split()
    if not parts:
        return "", ""
    if not parts[0].lstrip("-").isdigit():
        return parts[0], ""  # "running"
    number = int(parts[0])
    if number < 0:
        return "none", ""  # blocked, but not in a system call (a page fault)
    name = SYSCALLS.get(machine, {}).get(number, f"syscall {number}")
    if name in _ON_FILE and len(parts) > 1:
        try:
            return name, os.readlink(proc / "fd" / str(int(parts[1], 16)))
        except (OSError, ValueError):
            return name, ""
    return name, ""


def threads(pids, roles: dict | None = None, root: str | None = None) -> tuple[ThreadView, ...]:
    """Each thread of ``pids`` (``roles``: pid -> what it is), main threads first; a process gone is left out."""
    base, machine, roles = Path(root or PROC), os.uname().machine, roles or {}
    out: list[ThreadView] = []
    for pid in pids:
        proc = base / str(pid)
        try:
            tids = sorted((int(t.name) for t in (proc / "task").iterdir() if t.name.isdigit()), key=lambda t: t != pid)
        except OSError:
            continue
        for tid in tids[:MAX_THREADS]:
            task = proc / "task" / str(tid)
            fields = _stat_fields(_read(task / "stat"))
            if not fields:
                continue
            wchan = _read(task / "wchan")
            call, fd = _syscall(task, proc, machine)
            wchan = "" if wchan == "0" else wchan  # "0": not asleep, or its symbol hidden
            out.append(ThreadView(pid, tid, roles.get(pid, "other"), fields[0], wchan, call, fd))
    return tuple(out)


@dataclass(frozen=True)
class ProcessMove:
    """One process's counters at one reading."""

    start: int  # stat's starttime: a pid reused by another process is another process
    state: str
    cpu: float  # seconds of CPU, user and system
    io: int  # bytes read and written (files, pipes, sockets), or -1 unreadable


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def movement(pids, root: str | None = None) -> dict[int, ProcessMove]:
    """Each of ``pids``'s state, CPU time and I/O bytes now; a process gone (or unreadable) is left out."""
    base, out = Path(root or PROC), {}
    for pid in pids:
        fields = _stat_fields(_read(base / str(pid) / "stat"))
        if len(fields) < 20:
            continue
        io = dict(line.split(":", 1) for line in _read(base / str(pid) / "io").splitlines() if ":" in line)
        try:
            moved = int(io["rchar"]) + int(io["wchar"])
        except (KeyError, ValueError):
            moved = -1
        out[pid] = ProcessMove(int(fields[19]), fields[0], (int(fields[11]) + int(fields[12])) / _TICK, moved)
    return out
