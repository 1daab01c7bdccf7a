"""The classifier: one class per failure from its evidence (the runtime's words, tracebacks, stacks, kernel lines)."""

from __future__ import annotations

import pytest

from rocm_yolo.supervisor.diagnosis import (
    COLLECTIVE,
    DATA_ERROR,
    GPU_FAULT,
    GPU_HANG,
    GPU_OOM,
    HOST_OOM,
    LOADER,
    TRAINING_ERROR,
    UNKNOWN,
    Evidence,
    diagnose,
    oom_sizes,
)

HSA = (
    "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000. "
    "Reason: Page not present or supervisor privilege."
)
HW_HANG = "HW Exception by GPU node-1 (Agent handle: 0x563e71f098b0) reason :GPU Hang"
OOM = (
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.98 GiB "
    "of which 1.02 GiB is free. Of the allocated memory 5.91 GiB is allocated by PyTorch, and 312.00 MiB is reserved "
    "by PyTorch but unallocated."
)


def traceback(last: str, where: str = "/x/ultralytics/engine/trainer.py") -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{where}", line 10, in _do_train\n'
        "    self.run_callbacks('on_train_batch_end')\n"
        f"{last}\n"
    )


def stacks(*procs: tuple[int, str, list[list[tuple[str, str]]]]) -> str:
    """A stacks file as tree.dump_stacks writes it: (pid, role, threads), each thread innermost frame first."""
    out = []
    for pid, role, threads in procs:
        out.append(f"===== pid {pid} ({role}, sleeping): python -m rocm_yolo.trainer spec.json")
        for i, frames in enumerate(threads):
            out.append(f"{'Current thread' if i == 0 else 'Thread'} 0x00007f{i:010x} (most recent call first):")
            out += [f'  File "{f}", line 1 in {fn}' for f, fn in frames]
            out.append("")
    return "\n".join(out)


MAIN_TAIL = [("/x/rocm_yolo/trainer/__main__.py", "<module>"), ("/usr/lib/python3.11/runpy.py", "_run_code")]
LOADER_THREAD = [("/usr/lib/python3.11/threading.py", "wait"), ("/usr/lib/python3.11/threading.py", "_bootstrap")]


def test_the_hsa_runtimes_memory_access_fault_is_a_gpu_fault_whatever_its_addresses():
    first = diagnose(Evidence("crash", exit_code=-6, stderr=f"some output\n{HSA}\n"))
    assert first.cls == GPU_FAULT and first.title == "GPU memory access fault (page not present)"
    assert HSA in first.evidence and first.detail["node"] == 1
    other = diagnose(Evidence("crash", exit_code=-6, stderr=HSA.replace("0x7f3a1c000000", "0x7f00dead0000")))
    assert other.signature == first.signature  # the same fault at another address: the same failure


def test_the_runtimes_gpu_hang_and_a_hip_launch_failure():
    assert diagnose(Evidence("crash", exit_code=-6, stderr=HW_HANG)).cls == GPU_HANG
    hip = diagnose(
        Evidence("crash", exit_code=1, traceback=traceback("RuntimeError: HIP error: unspecified launch failure"))
    )
    assert hip.cls == GPU_FAULT and "unspecified launch failure" in hip.title


def test_the_kernel_says_page_fault_or_ring_timeout_when_the_child_died_silently():
    fault = "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:6 pasid:32784)"
    found = diagnose(Evidence("crash", exit_code=-9, kernel=(fault,)))
    assert found.cls == GPU_FAULT and found.evidence == (fault,)
    ring = "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1"
    assert diagnose(Evidence("crash", exit_code=-9, kernel=(ring,))).cls == GPU_HANG


def test_gpu_out_of_memory_with_its_sizes():
    found = diagnose(Evidence("crash", exit_code=1, traceback=traceback(OOM)))
    assert found.cls == GPU_OOM and found.title == "GPU out of memory"
    assert found.detail == oom_sizes(OOM)
    assert found.detail["tried"] == 2 << 30 and found.detail["reserved"] == 312 << 20
    assert found.detail["allocated"] == int(5.91 * (1 << 30)) and found.detail["total"] == int(7.98 * (1 << 30))


def test_host_out_of_memory_names_the_victim_only_when_it_was_the_runs():
    killed = "Out of memory: Killed process 4251 (pt_data_worker) total-vm:9000kB, anon-rss:8000kB"
    worker = traceback("RuntimeError: DataLoader worker (pid(s) 4251) exited unexpectedly")
    found = diagnose(Evidence("crash", exit_code=1, traceback=worker, kernel=(killed,), pids=frozenset({4242, 4251})))
    assert found.cls == HOST_OOM and "killed pt_data_worker (pid 4251)" in found.title
    assert found.detail == {"victim_pid": 4251, "victim": "pt_data_worker"}
    cgroup = "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/user.slice,task=python3,pid=4242,uid=1000"
    assert diagnose(Evidence("crash", exit_code=-9, kernel=(cgroup,), pids=frozenset({4242}))).cls == HOST_OOM
    # another user's process killed in the same minutes: the worker's death stays the loader's
    assert (
        diagnose(Evidence("crash", exit_code=1, traceback=worker, kernel=(killed,), pids=frozenset({1}))).cls == LOADER
    )
    assert diagnose(Evidence("crash", exit_code=1, traceback=traceback("MemoryError"))).cls == HOST_OOM


@pytest.mark.parametrize(
    "last, cls",
    [
        ("RuntimeError: DataLoader worker (pid 4251) is killed by signal: Killed.", LOADER),
        ("RuntimeError: DataLoader timed out after 300 seconds", LOADER),
        ("ValueError: Caught ValueError in DataLoader worker process 0.", DATA_ERROR),
        ("cv2.error: OpenCV(4.10.0) error: (-215:Assertion failed) !_src.empty()", DATA_ERROR),
        ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)", TRAINING_ERROR),
    ],
)
def test_crash_tracebacks(last, cls):
    assert diagnose(Evidence("crash", exit_code=1, traceback=traceback(last))).cls == cls


def test_an_error_raised_in_ultralytics_data_code_is_a_data_error():
    found = diagnose(
        Evidence("crash", exit_code=1, traceback=traceback("KeyError: 'cls'", "/x/ultralytics/data/augment.py"))
    )
    assert found.cls == DATA_ERROR and found.title == "data error (KeyError)"


def test_a_training_errors_signature_is_its_type_and_message_without_pids_or_addresses():
    one = diagnose(Evidence("crash", exit_code=1, traceback=traceback("RuntimeError: bad tensor at 0x7f01 in pid 42")))
    two = diagnose(Evidence("crash", exit_code=1, traceback=traceback("RuntimeError: bad tensor at 0x7f99 in pid 77")))
    assert one.cls == TRAINING_ERROR and one.title == "training error (RuntimeError)"
    assert one.signature == two.signature
    other = diagnose(Evidence("crash", exit_code=1, traceback=traceback("RuntimeError: another message")))
    assert other.signature != one.signature


def test_a_kill_without_evidence_is_unknown():
    found = diagnose(Evidence("crash", exit_code=-9))
    assert found.cls == UNKNOWN and "killed by SIGKILL" in found.title


def test_a_trainer_waiting_for_its_dataloader_is_a_loader_hang():
    trainer = [("/x/torch/utils/data/dataloader.py", "_try_get_data"), *MAIN_TAIL]
    worker = [("/x/rocm_yolo/testing/faults.py", "block_forever"), ("/x/ultralytics/data/base.py", "__getitem__")]
    found = diagnose(
        Evidence("hang", stacks=stacks((10, "trainer", [trainer, LOADER_THREAD]), (11, "worker", [worker])))
    )
    assert found.cls == LOADER and found.signature == "loader: hang in _try_get_data"
    assert any("worker pid 11: block_forever" in line for line in found.evidence)
    threads = [("/x/rocm_yolo/patches/threads.py", "_next_data"), *MAIN_TAIL]  # the threads profile
    assert diagnose(Evidence("hang", stacks=stacks((10, "trainer", [threads])))).cls == LOADER


def test_every_rank_in_a_collective_is_a_collective_hang_but_one_rank_stuck_elsewhere_is_not():
    in_reduce = [("/x/torch/distributed/distributed_c10d.py", "all_reduce"), *MAIN_TAIL]
    in_backward = [("/x/torch/autograd/__init__.py", "backward"), *MAIN_TAIL]
    launcher = [("/x/rocm_yolo/trainer/agent/launcher.py", "relay"), *MAIN_TAIL]
    hung = stacks((9, "trainer", [launcher]), (10, "rank", [in_backward]), (11, "rank", [in_reduce]))
    found = diagnose(Evidence("hang", stacks=hung, multi_gpu=True, on_gpu=True))
    assert found.cls == COLLECTIVE and len(found.evidence) == 2
    stuck = [("/x/rocm_yolo/testing/faults.py", "block_forever"), *MAIN_TAIL]  # rank 1 never joins
    one = stacks((9, "trainer", [launcher]), (10, "rank", [in_backward]), (11, "rank", [stuck]))
    for on_gpu in (False, True):  # rank 0 waits in DDP's backward (torch, on a GPU): a victim, not a GPU hang
        other = diagnose(Evidence("hang", stacks=one, multi_gpu=True, on_gpu=on_gpu))
        assert other.cls == UNKNOWN and other.title.startswith("hang (rank pid 11 in block_forever")


def test_a_hang_the_kernel_reports_or_a_trainer_stuck_in_torch_on_a_gpu_is_a_gpu_hang():
    stuck = [("/x/rocm_yolo/testing/faults.py", "block_forever"), *MAIN_TAIL]
    mes = "amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE"
    found = diagnose(Evidence("hang", stacks=stacks((10, "trainer", [stuck])), kernel=(mes,)))
    assert found.cls == GPU_HANG and found.title == "GPU hang (kernel log: MES)" and found.evidence == (mes,)
    in_torch = [("/x/torch/autograd/graph.py", "_engine_run_backward"), *MAIN_TAIL]
    on_gpu = diagnose(Evidence("hang", stacks=stacks((10, "trainer", [in_torch])), on_gpu=True))
    assert on_gpu.cls == GPU_HANG and "_engine_run_backward" in on_gpu.title
    assert diagnose(Evidence("hang", stacks=stacks((10, "trainer", [in_torch])))).cls == UNKNOWN  # on the CPU


def test_on_several_gpus_the_rank_that_failed_first_is_the_cause_not_the_others_errors():
    launcher = (
        "2026-11-25 07:25:15,123 ERROR torch.distributed.run: ChildFailedError\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_07:25:15\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4251)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 4251\n"
    )
    peer = traceback("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234")
    found = diagnose(Evidence("crash", exit_code=1, traceback=peer, launcher=launcher, multi_gpu=True))
    assert found.cls == UNKNOWN and found.title == "rank 1 killed by SIGKILL, no evidence of the cause"
    assert diagnose(Evidence("crash", exit_code=1, traceback=peer, multi_gpu=True)).cls == TRAINING_ERROR
    oom = "Out of memory: Killed process 4251 (python3) total-vm:1kB"  # but the kernel says why it was killed
    assert diagnose(Evidence("crash", 1, launcher=launcher, kernel=(oom,), multi_gpu=True)).cls == HOST_OOM


def test_py_spys_native_frames_in_the_hip_runtime_are_gpu_work():
    stuck = [("/x/ultralytics/engine/trainer.py", "_do_train"), *MAIN_TAIL]
    native = (
        "--- py-spy dump --native (exit 0):\nProcess 10: python -m rocm_yolo.trainer\nPython v3.11.7\n\n"
        'Thread 10 (idle): "MainThread"\n    hsa_signal_wait_scacquire (libhsa-runtime64.so.1)\n'
        "    hipDeviceSynchronize (libamdhip64.so.6)\n    _do_train (ultralytics/engine/trainer.py:420)\n"
        'Thread 12 (idle): "pt_autograd_0"\n    futex_wait (libc.so.6)\n'
    )
    text = stacks((10, "trainer", [stuck])) + native
    found = diagnose(Evidence("hang", stacks=text, on_gpu=True))
    assert found.cls == GPU_HANG and found.title == "main-process hang inside GPU work (in hsa_signal_wait_scacquire)"
    assert diagnose(Evidence("hang", stacks=text)).cls == UNKNOWN  # no GPU: no GPU work


def test_any_hip_error_of_the_training_step_is_the_gpus_but_its_out_of_memory_is_gpu_oom():
    code = diagnose(Evidence("crash", 1, traceback=traceback("RuntimeError: HIP error: invalid device function")))
    assert code.cls == GPU_FAULT and code.title == "GPU error (HIP error: invalid device function)"
    oom = diagnose(Evidence("crash", 1, traceback=traceback("RuntimeError: HIP error: out of memory")))
    assert oom.cls == GPU_OOM


def test_a_worker_killed_by_sigkill_names_the_usual_sender_and_what_the_kernel_log_said():
    import signal

    killed = f"RuntimeError: DataLoader worker (pid 4251) is killed by signal: {signal.strsignal(signal.SIGKILL)}."
    quiet = diagnose(Evidence("crash", exit_code=1, traceback=traceback(killed), kernel_source="/dev/kmsg"))
    assert quiet.cls == LOADER and "out-of-memory killer" in quiet.title and "no OOM-killer line" in quiet.title
    unreadable = "kernel log not readable (dmesg: permission denied)"
    closed = diagnose(Evidence("crash", exit_code=1, traceback=traceback(killed), kernel_source=unreadable))
    assert "out-of-memory killer" in closed.title and unreadable in closed.title
    ours = "RuntimeError: DataLoader worker (pid(s) 4251) exited unexpectedly: pid 4251 killed by SIGKILL"
    assert "out-of-memory killer" in diagnose(Evidence("crash", exit_code=1, traceback=traceback(ours))).title
    segv = f"RuntimeError: DataLoader worker (pid 4251) is killed by signal: {signal.strsignal(signal.SIGSEGV)}."
    assert "out-of-memory" not in diagnose(Evidence("crash", exit_code=1, traceback=traceback(segv))).title
