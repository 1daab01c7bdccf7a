"""What the kernel says of a process tree (/proc): where each thread waits, whether the processes move; and the run's
memory cgroup (its OOM kills and limit). Real processes, and fake trees where the machine cannot make the case."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocm_yolo.process import cgroup, kernel_view

MACHINE = os.uname().machine
NUMBER = {name: nr for nr, name in kernel_view.SYSCALLS.get(MACHINE, {}).items()}


def fake_task(root: Path, pid: int, tid: int, state: str, wchan: str, syscall: str, fds: dict | None = None) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "stat").write_text(f"{tid} (pt_main (thread)) {state} 1 1 1 0 -1 0 0 0 0 0 12 3 0 0 20 0 9 0 4242 0 0\n")
    (task / "wchan").write_text(wchan)
    (task / "syscall").write_text(syscall)
    for fd, target in (fds or {}).items():
        (root / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "fd" / str(fd)).symlink_to(target)


@pytest.mark.skipif(not NUMBER, reason=f"no system call table for {MACHINE}")
def test_a_main_thread_in_a_kfd_ioctl_waits_in_the_gpu_driver_and_a_futex_is_a_wait(tmp_path):
    fake_task(
        tmp_path, 40, 40, "S", "kfd_wait_on_events", f"{NUMBER['ioctl']} 0x5 0xc0184b0c 0x7ffd 0 0 0", {5: "/dev/kfd"}
    )
    fake_task(tmp_path, 40, 41, "S", "futex_wait_queue", f"{NUMBER['futex']} 0x7f00 0x80 0 0 0 0")
    fake_task(tmp_path, 50, 50, "R", "0", "running")
    main, helper, worker = kernel_view.threads([40, 50, 60], {40: "trainer", 50: "worker"}, str(tmp_path))  # 60: gone
    assert (main.main, main.syscall, main.fd, main.on_gpu, main.role) == (True, "ioctl", "/dev/kfd", True, "trainer")
    assert (helper.main, helper.syscall, helper.on_gpu) == (False, "futex", False)
    assert (worker.state, worker.syscall, worker.wchan, worker.on_gpu) == ("R", "running", "", False)
    assert "trainer pid 40: state S, in ioctl on /dev/kfd, wchan kfd_wait_on_events" == main.line()


def test_a_real_sleeping_and_a_real_stopped_process(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = kernel_view.threads([proc.pid], {proc.pid: "trainer"})
            main = next((t for t in view if t.main), None)
            if main is not None and main.state == "S" and main.syscall not in ("", "running"):
                break
            time.sleep(0.1)
        assert main is not None and main.state == "S" and not main.on_gpu
        if MACHINE in kernel_view.SYSCALLS:  # readable by the process's parent: its call is named
            assert main.syscall in ("clock_nanosleep", "nanosleep", "select", "pselect6"), main
        before = kernel_view.movement([proc.pid])[proc.pid]
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while kernel_view.movement([proc.pid])[proc.pid].state != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        after = kernel_view.movement([proc.pid])[proc.pid]
        assert after.state == "T" and after.start == before.start and after.cpu >= before.cpu
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in kernel_view.movement([proc.pid])  # gone: left out, not guessed


def test_movement_counts_cpu_and_io(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import os\nwhile True: os.urandom(1 << 16)"])
    try:
        first = kernel_view.movement([proc.pid])[proc.pid]
        time.sleep(1.5)
        later = kernel_view.movement([proc.pid])[proc.pid]
        assert later.cpu > first.cpu and (later.io >= first.io >= 0 or first.io == -1)
    finally:
        proc.kill()
        proc.wait()


def cgroup_v2(root: Path, path: str, kills: int, limits: dict) -> Path:
    """A fake /proc/self/cgroup naming ``path`` (v2) and its /sys/fs/cgroup, ``limits`` by folder."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(f"0::{path}\n")
    folder = root / "cg" / path.lstrip("/")
    folder.mkdir(parents=True)
    (folder / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
    for where, limit in limits.items():
        (root / "cg" / where / "memory.max").write_text(f"{limit}\n")
    return folder


def test_cgroup_v2_counts_oom_kills_and_the_tightest_limit_above_counts(tmp_path):
    folder = cgroup_v2(tmp_path, "/job/step", 2, {"job/step": "max", "job": 8 << 30})
    found = cgroup.read(str(tmp_path / "proc"), str(tmp_path / "cg"))
    assert (found.version, found.oom_kills, found.limit) == (2, 2, 8 << 30)
    assert found.path == str(folder) and found.limit_at.endswith("job/memory.max") and not found.why


def test_cgroup_v1_counts_with_the_hierarchical_limit_and_no_limit_is_none(tmp_path):
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/slurm/job_7\n1:cpu:/\n")
    folder = tmp_path / "cg" / "memory" / "slurm" / "job_7"
    folder.mkdir(parents=True)
    (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (folder / "memory.stat").write_text("cache 0\nhierarchical_memory_limit 4294967296\n")
    found = cgroup.read(str(tmp_path / "proc"), str(tmp_path / "cg"))
    assert (found.version, found.oom_kills, found.limit) == (1, 1, 4 << 30)
    (folder / "memory.stat").write_text("hierarchical_memory_limit 9223372036854771712\n")
    assert cgroup.read(str(tmp_path / "proc"), str(tmp_path / "cg")).limit is None  # PAGE_COUNTER_MAX: none


def test_an_unreadable_cgroup_is_said_never_guessed(tmp_path):
    found = cgroup.read(str(tmp_path / "no-proc"), str(tmp_path / "cg"))
    assert found.oom_kills is None and "not readable" in found.why
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("4:memory:/x\n")
    (tmp_path / "cg" / "memory" / "x").mkdir(parents=True)
    (tmp_path / "cg" / "memory" / "x" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    old = cgroup.read(str(tmp_path / "proc"), str(tmp_path / "cg"))  # a kernel before 4.13: no count
    assert old.oom_kills is None and "no oom_kill" in old.why


def test_this_machines_own_cgroup_reads_or_says_why():
    found = cgroup.read()
    assert (found.oom_kills is not None) or found.why.startswith("cgroup not readable")
