"""End to end (issue 44): the five kinds of failure whose text alone cannot decide them, named right from what a person
at the machine would look at, with real processes killed, hung and stopped for real: the run's cgroup counting an OOM
kill, the labels against nc, the kernel's view of a hung thread, the GPU override against the card, a start-up that
stopped moving. The fake sources are tests/seams' (a cgroup and a /proc tree, a KFD topology)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import (
    TINY,
    child_pid,
    epochs_in,
    events,
    kfd_tree,
    rocm_lines,
    wait_for,
    with_cgroup,
    with_proc,
)
from rocm_yolo.process.kernel_view import SYSCALLS
from rocm_yolo.run import heartbeat
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import read_state

pytestmark = pytest.mark.e2e

STALL = 10


class _none:  # what a file not written yet reads as
    batches_total = 0
    still = None


WATCH = ["--stall-timeout", str(STALL), "--workers", "2"]


def test_a_sigkilled_trainer_the_runs_cgroup_counted_is_host_memory_with_what_takes_it(cli, tiny_data, tmp_path):
    """No kernel line (a container): the cgroup's own count of OOM kills decides, strongly; the restart goes down the
    ladder and says what the cgroup allows and what the workers and the batch cost."""
    run = tmp_path / "runs" / "detect" / "train"
    cgroup = with_cgroup(cli, tmp_path, limit=2 << 30)
    proc = cli.start("train", str(tiny_data), "--epochs", "2", *WATCH, *TINY)
    trainer = child_pid(run, proc, cli)
    wait_for(lambda: (heartbeat.read(RunPaths(run).heartbeat) or _none).batches_total >= 1, 200, "training", proc, cli)
    cgroup.kill()  # the kernel counts the kill in the victim's cgroup as it kills
    os.kill(trainer, signal.SIGKILL)
    r = cli.wait(proc, 300)
    assert r.returncode == 0, r.stdout[-3000:]
    [crash] = events(run, "crash")
    assert crash["class"] == "host-oom" and not crash["weak"], crash
    assert "the run's cgroup counted 1 OOM kill(s) during the attempt (it allows 2.0 GiB)" in crash["message"]
    [restart] = events(run, "restart")
    assert restart["profile"] == "safe" and "the run's cgroup allows 2.0 GiB" in restart["message"]
    assert "DataLoader workers hold 4 batches each in flight" in restart["message"]
    report = (run / "crash-1.txt").read_text()
    assert "the run's memory cgroup: 1 OOM kill(s) during the attempt" in report
    assert "oom_kill 0 at the attempt's start, 1 at its end" in report
    assert epochs_in(run) == [1, 2] and cli.leftovers() == []


def test_an_index_error_with_a_label_class_id_out_of_range_is_a_data_error_naming_the_file(cli, tiny_data, tmp_path):
    """A device-side assert on a GPU, an IndexError on the CPU (the fault's loss): the labels are checked against the
    data set's nc as the doctor checks them, and the one whose class id is out of range is named with its line."""
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(tiny_data.parent), str(data)], check=True)
    yaml = data / tiny_data.name
    yaml.write_text(yaml.read_text().replace(str(tiny_data.parent), str(data)))
    label = sorted((data / "labels" / "train").glob("*.txt"))[5]
    lines = label.read_text().splitlines()
    label.write_text("\n".join([*lines, "7 0.5 0.5 0.2 0.2"]) + "\n")  # names has 3 classes: 0-2
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run(
        "train", str(yaml), "--epochs", "1", *WATCH, *TINY, env={"ROCM_YOLO_FAULT": "device-assert@1:2"}, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:]
    [crash] = events(run, "crash")
    where = f"{label}:{len(lines) + 1}: class id 7 out of range (names has 3: 0-2)"
    assert crash["class"] == "data-error" and where in crash["message"], crash
    report = (run / "crash-1.txt").read_text()
    assert "IndexError" in report and "train label files checked against nc=3" in report
    assert cli.leftovers() == []


@pytest.mark.skipif(os.uname().machine not in SYSCALLS, reason="no system call table for this machine")
def test_a_hang_whose_stacks_show_only_the_loop_and_whose_thread_waits_in_a_kfd_ioctl_is_a_gpu_hang(
    cli, tiny_data, tmp_path
):
    """The trainer's main thread blocks (a real hang); its Python stack names no place the rules know, and the kernel's
    view (a fake /proc for its pid: the machine has no GPU) has it in an ioctl on /dev/kfd: the GPU stopped answering.
    The remedy: the same profile, not the loader ladder."""
    run = tmp_path / "runs" / "detect" / "train"
    root = with_proc(cli, tmp_path)
    proc = cli.start("train", str(tiny_data), "--epochs", "1", *WATCH, *TINY, env={"ROCM_YOLO_FAULT": "main-hang@1:2"})
    trainer = child_pid(run, proc, cli)
    task = root / str(trainer) / "task" / str(trainer)
    task.mkdir(parents=True)
    (task / "stat").write_text(f"{trainer} (python) S 1 1 1 0 -1 0 0 0 0 0 500 60 0 0 20 0 30 0 4242 0 0\n")
    (task / "wchan").write_text("kfd_wait_on_events")
    ioctl = next(nr for nr, name in SYSCALLS[os.uname().machine].items() if name == "ioctl")
    (task / "syscall").write_text(f"{ioctl} 0x7 0xc0184b0c 0x7ffc2a3b1c40 0x0 0x0 0x0 0x7ffc2a3b1b88 0x7f3a1c2b3d4e\n")
    (root / str(trainer) / "fd").mkdir()
    (root / str(trainer) / "fd" / "7").symlink_to("/dev/kfd")
    r = cli.wait(proc, 300)
    assert r.returncode == 0, r.stdout[-3000:]
    [hang] = events(run, "hang")
    assert hang["class"] == "gpu-hang" and "waits in the GPU driver (ioctl on /dev/kfd)" in hang["message"], hang
    assert [e["profile"] for e in events(run, "restart")] == ["fast"]  # the same profile: the loader is not the cause
    stacks = (run / "hang-1-stacks.txt").read_text()
    assert f"trainer pid {trainer}: state S, in ioctl on /dev/kfd, wchan kfd_wait_on_events" in stacks
    assert cli.leftovers() == []


def test_a_gpu_fault_with_an_override_of_another_architecture_stops_with_the_override_as_its_cause(
    cli, tiny_data, tmp_path
):
    """The HSA runtime's page fault, on a card the KFD topology says is a gfx1100, run as a gfx1030 by
    HSA_OVERRIDE_GFX_VERSION=10.3.0: the environment's failure; no retry on the same settings, exit 4, and the fix
    is no override (or the card's own), not a retry."""
    run = tmp_path / "runs" / "detect" / "train"
    env = {
        "ROCM_YOLO_FAULT": "gpu-fault@1:2",
        "ROCM_YOLO_KFD_ROOT": str(kfd_tree(tmp_path / "kfd", 110000)),
        "HSA_OVERRIDE_GFX_VERSION": "10.3.0",
    }
    r = cli.run("train", str(tiny_data), "--epochs", "1", *WATCH, *TINY, env=env, timeout=300)
    assert r.returncode == 4, r.stdout[-3000:]
    [crash] = events(run, "crash")
    assert crash["class"] == "environment", crash
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0 on a gfx1100 card: the override runs it as gfx1030" in crash["message"]
    assert events(run, "restart") == []
    assert any("no HSA_OVERRIDE_GFX_VERSION (unset it" in line for line in rocm_lines(r.stdout))
    assert "gfx1100: 10.3.0 (runs it as gfx1030)" in (run / "crash-1.txt").read_text()
    assert cli.leftovers() == []


def test_a_sigsegv_in_torchs_first_call_into_the_gpu_runtime_stops_at_once_as_the_environment(cli, tiny_data, tmp_path):
    """A runtime that faults as torch starts it (strixhalo-toolbox61: a bare SIGSEGV, exit 139, at
    torch.cuda.is_available()): the trainer's faulthandler writes where Python stood, and that decides: the installed
    runtime cannot start on this machine. Exit 4 at once, no lighter loader tried, nothing left behind."""
    run = tmp_path / "runs" / "detect" / "train"
    env = {"ROCM_YOLO_FAULT": "runtime-start-fault@1:2"}
    r = cli.run("train", str(tiny_data), "--epochs", "1", *WATCH, *TINY, env=env, timeout=300)
    assert r.returncode == 4, r.stdout[-3000:]
    [crash] = events(run, "crash")
    assert crash["class"] == "environment" and crash["exit_code"] == -signal.SIGSEGV, crash
    assert "as the GPU runtime started" in crash["message"] and "in is_available" in crash["message"], crash
    assert events(run, "restart") == []
    stderr = RunPaths(run).child_stderr(1).read_text()
    assert "(most recent call first):" in stderr and "torch/cuda/__init__.py" in stderr  # faulthandler's dump
    assert cli.leftovers() == []


def test_a_start_up_stopped_with_sigstop_is_a_hang_in_the_stall_timeout_plus_30_s_and_status_says_so(
    cli, tiny_data, tmp_path
):
    """SIGSTOP into the trainer while it imports torch (no heartbeat yet): with the default 900 s start-up grace, found
    after the stall timeout; `rocm-yolo status` says the trainer is stopped, and for how long, meanwhile."""
    stall = 20  # room for a status call on a busy machine before the hang is found
    run = tmp_path / "runs" / "detect" / "train"
    proc = cli.start("train", str(tiny_data), "--epochs", "1", "--stall-timeout", str(stall), "--workers", "2", *TINY)
    trainer = child_pid(run, proc, cli)
    os.kill(trainer, signal.SIGSTOP)
    wait_for(lambda: (read_state(RunPaths(run)) or _none).still is not None, stall, "the stop told", proc, cli)
    said = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "status", str(run), "--json"], capture_output=True, text=True, timeout=60
    )
    info = json.loads(said.stdout)
    assert info["stopped"] is True and info["still_seconds"] >= 0, info
    r = cli.wait(proc, 300)
    assert r.returncode == 0, r.stdout[-3000:]
    [hang] = events(run, "hang")
    assert hang["seconds"] <= stall + 30  # the goal: the stall timeout plus 30 s, not the 900 s grace
    assert f"pid {trainer} is stopped (not by rocm-yolo's Ctrl-Z)" in r.stdout
    assert epochs_in(run) == [1] and cli.leftovers() == []
    assert read_state(RunPaths(run)).still is None  # over: nothing stopped to tell of
