"""The classifier: one class per failure from its evidence (the runtime's words, tracebacks, stacks, kernel lines)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rocm_yolo.diagnosis.diagnose import (
    COLLECTIVE,
    DATA_ERROR,
    ENVIRONMENT,
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
    assert oom_sizes(OOM).items() <= found.detail.items()
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
    # another user's process killed in the same minutes (evidence.gather sorts it out): the death stays the loader's
    assert diagnose(Evidence("crash", exit_code=1, traceback=worker, kernel_others=(killed,))).cls == LOADER
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
    threads = [("/x/rocm_yolo/patches/loaders/threads.py", "_next_data"), *MAIN_TAIL]  # the threads profile
    assert diagnose(Evidence("hang", stacks=stacks((10, "trainer", [threads])))).cls == LOADER


def test_the_hang_report_names_only_the_tools_that_read_the_stacks():
    """faulthandler where a process wrote its threads; py-spy only where it was installed and dumped a process (it
    said "faulthandler, py-spy" where py-spy was not installed)."""
    trainer = [("/x/torch/utils/data/dataloader.py", "_try_get_data"), *MAIN_TAIL]
    plain = stacks((10, "trainer", [trainer]))
    assert diagnose(Evidence("hang", stacks=plain)).why == "the stacks of the hung processes (faulthandler)"
    refused = plain + "\n--- py-spy: no answer within 10 s\n"  # installed, and did not answer
    assert diagnose(Evidence("hang", stacks=refused)).why == "the stacks of the hung processes (faulthandler)"
    dumped = plain + '\n--- py-spy dump --native (exit 0):\nThread 10 (idle): "MainThread"\n    poll (libc.so.6)\n'
    assert diagnose(Evidence("hang", stacks=dumped)).why == "the stacks of the hung processes (faulthandler, py-spy)"


def test_every_rank_in_a_collective_is_a_collective_hang_but_one_rank_stuck_elsewhere_is_not():
    in_reduce = [("/x/torch/distributed/distributed_c10d.py", "all_reduce"), *MAIN_TAIL]
    in_backward = [("/x/torch/autograd/__init__.py", "backward"), *MAIN_TAIL]
    launcher = [("/x/rocm_yolo/ddp/launcher.py", "relay"), *MAIN_TAIL]
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
    assert found.cls == UNKNOWN and found.title.startswith("rank 1 killed by SIGKILL, no evidence of the cause")
    assert found.signature == ""  # no word of its own: never "the same failure"
    # alone, gloo's lost connection is a collective that failed between the ranks (its source: gloo's pair.cc)
    assert diagnose(Evidence("crash", exit_code=1, traceback=peer, multi_gpu=True)).cls == "collective"
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


def test_a_hangs_own_native_frames_of_its_main_thread_waiting_for_the_gpus_signal_are_a_gpu_hang():
    """ROCr's signal wait (InterruptSignal::WaitRelaxed, hsa_signal_wait_*) in the main thread: the GPU never set the
    signal. In another thread it decides nothing (ROCclr's hostcall listener waits on its signal all the time), and in
    a crash's output it is no word of a failure."""
    wait = "    rocr::core::InterruptSignal::WaitRelaxed (libhsa-runtime64.so.1)\n"
    found = diagnose(Evidence("hang", stderr=wait))
    assert found.cls == GPU_HANG and "InterruptSignal::WaitRelaxed" in found.title
    dump = (
        'Thread 11 (idle): "hostcall"\n' + wait + "    start_thread (libc.so.6)\n"
        'Thread 10 (idle): "MainThread"\n    futex_wait (libc.so.6)\n    _do_train (trainer.py:420)\n'
    )
    assert diagnose(Evidence("hang", stderr=dump)).cls != GPU_HANG
    main = dump.replace(
        '"MainThread"\n    futex_wait (libc.so.6)', '"MainThread"\n    hsa_signal_wait_scacquire (x.so)'
    )
    assert diagnose(Evidence("hang", stderr=main)).cls == GPU_HANG
    assert diagnose(Evidence("crash", exit_code=-11, stderr=wait)).cls != GPU_HANG
    # py-spy's own dump of the trainer (the stacks file): ROCr's C++ frames are the HIP runtime's
    stuck = [("/x/ultralytics/engine/trainer.py", "_do_train"), *MAIN_TAIL]
    native = '--- py-spy dump --native (exit 0):\nProcess 10: python\n\nThread 10 (idle): "MainThread"\n' + wait
    text = stacks((10, "trainer", [stuck])) + native
    assert diagnose(Evidence("hang", stacks=text, on_gpu=True)).cls == GPU_HANG


def test_any_hip_error_of_the_training_step_is_the_gpus_but_its_out_of_memory_is_gpu_oom():
    code = diagnose(Evidence("crash", 1, traceback=traceback("RuntimeError: HIP error: unspecified launch failure")))
    assert code.cls == GPU_FAULT and code.title == "GPU error (unspecified launch failure)"
    other = diagnose(Evidence("crash", 1, traceback=traceback("RuntimeError: HIP error: an unknown error")))
    assert other.cls == GPU_FAULT and other.title == "GPU error (an unknown error)"
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


# --------------------------------------------------------------------------- issue 30: evidence is the failure's own

INVALID_FUNCTION = "RuntimeError: HIP error: invalid device function"


def loader_hang_stacks() -> str:
    waits = [("/x/torch/utils/data/dataloader.py", "_next_data"), *MAIN_TAIL]
    return stacks((100, "trainer", [waits]), (101, "worker", [[("/x/ultralytics/data/base.py", "load_image")]]))


def test_rocm_yolos_own_lines_are_never_the_childs_evidence():
    from rocm_yolo.run.events import foreign

    header = "rocm-yolo: conv: aten (auto: native failed: RuntimeError: HIP error: invalid device function)\n"
    assert foreign(header + "\rrocm-yolo: rank 1: loaders: workers=2\nreal words\n").strip() == "real words"
    found = diagnose(Evidence("hang", stderr=foreign(header), stacks=loader_hang_stacks()))
    assert found.cls == LOADER and not found.weak


def test_a_loader_hang_after_a_handled_hip_error_is_a_loader_hang():
    handled = f'Traceback (most recent call last):\n  File "x.py", line 1, in probe\n{INVALID_FUNCTION}\n'
    for where in ({"earlier": handled}, {"stderr": handled}):  # before its last progress, or after it
        found = diagnose(Evidence("hang", stacks=loader_hang_stacks(), **where))
        assert found.cls == LOADER and not found.weak, where


def test_another_processes_kernel_line_never_decides_a_class():
    xorg = (
        "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:6 pasid:32770, for process Xorg "
        "pid 901 thread Xorg pid 901)"
    )
    raised = traceback("RuntimeError: something in the step")
    found = diagnose(Evidence("crash", exit_code=1, traceback=raised, kernel_others=(xorg,)))
    assert found.cls == TRAINING_ERROR  # what the process itself raised
    killed = diagnose(Evidence("crash", exit_code=-9, kernel_others=(xorg,), kernel_source="/dev/kmsg"))
    assert killed.cls == UNKNOWN and killed.signature == ""  # a kill without a word: nothing to repeat


def test_an_earlier_line_or_an_unnamed_kernel_line_only_suggests_and_never_stops():
    found = diagnose(Evidence("crash", exit_code=-11, earlier=f"{INVALID_FUNCTION}\n", kernel_source="/dev/kmsg"))
    assert found.cls == ENVIRONMENT and found.weak and found.signature == ""
    ring = "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1"  # no pid, no card
    hung = diagnose(Evidence("crash", exit_code=-6, kernel_context=(ring,), kernel_source="/dev/kmsg"))
    assert hung.cls == GPU_HANG and hung.weak


@pytest.mark.parametrize(
    "text, cls",
    [
        ('"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"', ENVIRONMENT),
        ("RuntimeError: HIP error: no kernel image is available for execution on the device", ENVIRONMENT),
        ("RuntimeError: No HIP GPUs are available", ENVIRONMENT),
        ("rocBLAS error: Cannot read /opt/rocm/lib/rocblas/library/TensileLibrary.dat: No such file", ENVIRONMENT),
        (
            ":0:rocdevice.cpp            :2984: 6545699276902 us: [pid:196431 tid:0x7f2301dff640] Callback: Queue "
            "0x7f7f4d000000 aborting with error : HSA_STATUS_ERROR_INVALID_ISA: The instruction set architecture is "
            "invalid. code: 0x100f",
            ENVIRONMENT,
        ),
        (
            ":0:rocdevice.cpp            :2984: 6545699276902 us: [pid:196431 tid:0x7f2301dff640] Callback: Queue "
            "0x7f2301400000 aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to "
            "access memory beyond the largest legal address. code: 0x29",
            GPU_FAULT,
        ),
        (
            ":0:rocdevice.cpp :2984: Callback: Queue 0x1 aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL "
            "operation resulted in a hardware exception. code: 0x1016",
            GPU_FAULT,
        ),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x1) on address 0x2. Reason: Generic hang recovery.",
            GPU_HANG,
        ),
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 2359296 bytes. Error code 12 (Cannot allocate memory)",
            HOST_OOM,
        ),
        ("numpy._core._exceptions._ArrayMemoryError: Unable to allocate 7.91 GiB for an array", HOST_OOM),
        (
            "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, Timeout(ms)=600000) ran for 600012 milliseconds before "
            "timing out.",
            COLLECTIVE,
        ),
        ("RuntimeError: unable to write to file </torch_169035_1920244589_10>: No space left on device (28)", LOADER),
        (
            "/pytorch/aten/src/ATen/native/hip/Loss.hip:250: nll_loss_forward_reduce_cuda_kernel_2d: Device-side "
            "assertion `t >= 0 && t < n_classes' failed.",
            TRAINING_ERROR,
        ),
        # the runtime error strings of cudaGetErrorString / hipGetErrorString beside the illegal address
        ("torch.AcceleratorError: CUDA error: an illegal instruction was encountered", GPU_FAULT),
        ("torch.AcceleratorError: CUDA error: misaligned address", GPU_FAULT),
        # NCCL/RCCL's shmutils.cc: "Error while %s shared memory segment %s (size %zu)"
        (
            "misc/shmutils.cc:72 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)",
            COLLECTIVE,
        ),  # fmt: skip
        # CPython's multiprocessing/spawn.py, _check_not_importing_main
        (
            "RuntimeError:\n        An attempt has been made to start a new process before the\n        current "
            "process has finished its bootstrapping phase.",
            LOADER,
        ),
        # Ultralytics' check_det_dataset
        ("FileNotFoundError: Dataset 'data.yaml' images not found, missing path '/data/images/val'", DATA_ERROR),
        # torch's c10/cuda/CUDAFunctions.cpp device_count: TORCH_WARN("CUDA initialization: ", ...), hipified
        (
            "UserWarning: HIP initialization: Unexpected error from hipGetDeviceCount(). Did you run some cuda "
            "functions before calling NumHipDevices() that might have already set an error? Error 100: no ROCm-capable "
            "device is detected",
            ENVIRONMENT,
        ),
        (
            "UserWarning: CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up",
            ENVIRONMENT,
        ),
        # ROCm/clr hip_module.cpp: LogPrintfError("Launch params (%u, %u, %u) are larger than launch bounds (%lu) ...")
        # before torch's hipErrorLaunchFailure: the build, not the GPU
        (
            ":1:hip_module.cpp :295 : 1 us: Launch params (512, 1, 1) are larger than launch bounds (256) for kernel "
            "_Z6kernelPf\nRuntimeError: HIP error: unspecified launch failure",
            ENVIRONMENT,
        ),
        # HIP's hipErrorMemoryAllocation (1002 before ROCm 3.x, then 2): printed by name or by value
        ("hipMalloc failed: hipErrorMemoryAllocation", GPU_OOM),
        ("failed to allocate 4.00G (4294967296 bytes) from device: hipError_t(1002)", GPU_OOM),
        # torch 1.x's TH allocator (aten/src/TH/THGeneral.cpp THAlloc)
        (
            "RuntimeError: $ Torch: not enough memory: you tried to allocate 64GB. Buy new RAM! at THGeneral.cpp:204",
            HOST_OOM,
        ),
        # ProcessGroupNCCL.cpp's watchdog, as c10::Error's frames and "Exception raised from" show it
        (
            "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
            "std::ratio<1l, 1000l> > >) + 0x1e6 (0x7f in /x/torch/lib/libtorch_cuda.so)",
            COLLECTIVE,
        ),
        (
            "Exception raised from ncclCommWatchdog at /x/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1900",
            COLLECTIVE,
        ),
    ],
)
def test_the_runtimes_own_words(text, cls):
    assert diagnose(Evidence("crash", exit_code=-6, stderr=text + "\n")).cls == cls


def test_ultralytics_warnings_in_the_words_of_a_data_error_decide_nothing():
    """check_det_dataset warns in the same words before it downloads or splits a data set, and training goes on."""
    warned = (
        "WARNING ⚠️ Dataset 'coco8.yaml' images not found, missing path '/data/coco8/images/val'\n"
        "WARNING ⚠️ Dataset 'split=train' not found at /data/x/train\n"
        "UBSan: runtime error: load of misaligned address 0x55 for type 'int'\n"
    )
    trace = "Traceback (most recent call last):\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"
    assert diagnose(Evidence("crash", exit_code=1, stderr=warned + trace, traceback=trace)).cls == TRAINING_ERROR
    assert diagnose(Evidence("crash", exit_code=-11, stderr=warned)).cls not in (DATA_ERROR, GPU_FAULT)


def test_a_collective_timeout_written_during_a_hang_is_a_collective_hang():
    said = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 1800812"
    main = [("/x/ultralytics/engine/trainer.py", "_do_train"), *MAIN_TAIL]
    found = diagnose(Evidence("hang", stderr=said, stacks=stacks((7, "rank", [main])), multi_gpu=True))
    assert found.cls == COLLECTIVE


def test_in_a_hang_the_kernels_word_of_a_gpu_hang_beats_the_loader_stacks():
    ring = "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3"
    found = diagnose(Evidence("hang", stacks=loader_hang_stacks(), kernel=(ring,)))
    assert found.cls == GPU_HANG and found.evidence == (ring,)


def test_a_process_stopped_from_outside_is_no_failure_of_its_own():
    text = loader_hang_stacks().replace("(worker, sleeping)", "(worker, stopped)")
    found = diagnose(Evidence("hang", stacks=text))
    assert found.cls == UNKNOWN and found.signature == "" and "stopped by a signal" in found.title


def test_a_data_error_names_the_file_not_the_source_line_that_raised_it():
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/x/ultralytics/data/base.py", line 158, in load_image\n'
        '    raise FileNotFoundError(f"Image Not Found {f}")\n'
        "FileNotFoundError: Image Not Found /data/images/train/0042.jpg\n"
    )
    found = diagnose(Evidence("crash", exit_code=1, traceback=trace))
    assert found.cls == DATA_ERROR and "/data/images/train/0042.jpg" in found.title and "{f}" not in found.title


@settings(max_examples=60, deadline=None)
@given(
    pid=st.integers(1, 4_000_000),
    address=st.integers(0, 2**48),
    tmp=st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=4, max_size=10),
    worker=st.integers(0, 63),
    stamp=st.datetimes(),
    step=st.integers(0, 10**6),
)
@example(pid=1, address=0, tmp="0000", worker=0, stamp=datetime(2000, 2, 29), step=0)  # a leap day (once a failure)
def test_one_failure_with_other_pids_addresses_paths_times_and_workers_has_one_signature(
    pid, address, tmp, worker, stamp, step
):
    from rocm_yolo.diagnosis.diagnose import normalized

    def said(p, a, t, w, when, s) -> str:
        return (
            f"{when.isoformat(sep=' ')} [pid {p}] RuntimeError: Caught ValueError in DataLoader worker process {w} "
            f"at step {s}: bad value in /tmp/tmp{t}/batch.npy at 0x{a:x}"
        )

    base = normalized(said(1234, 0xDEAD, "abcd", 0, datetime(2026, 11, 27, 9, 30, 1, 250000), 7))  # another time
    assert normalized(said(pid, address, tmp, worker, stamp, step)) == base
    other = normalized(said(1234, 0xDEAD, "abcd", 0, stamp, 7).replace("ValueError", "KeyError"))
    assert other != base  # two exception types: two failures


def test_a_crash_report_counts_other_processes_kernel_lines_and_is_0640(tmp_path):
    """Another user's processes are named in the kernel's lines (``for process Xorg pid 901``): the report, which
    the user's group may read, says how many there were, never what they say (issue 45)."""
    import os
    import stat

    from rocm_yolo.diagnosis.evidence import write_report
    from rocm_yolo.diagnosis.record import Diagnosis, Evidence

    xorg = "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:6, for process Xorg pid 901"
    found = Evidence("crash", exit_code=-6, kernel_others=(xorg, "Out of memory: Killed process 77 (chrome)"))
    path = write_report(tmp_path / "crash-1.txt", Diagnosis("unknown", "a crash", ""), found, "epoch 1")
    text = path.read_text()
    assert "kernel lines of other processes or cards (never this run's): 2" in text
    assert "Xorg" not in text and "chrome" not in text and stat.S_IMODE(os.stat(path).st_mode) == 0o640


@pytest.mark.parametrize(
    "code, text",
    [
        (-11, "#0  0x00007fffa6ed9cd8 in  () at /opt/rocm/hip/lib/libamdhip64.so.5"),  # gdb's frame
        (139, "#3 0x7f12 in rocr::AMD::GpuAgent::InitDma() () from /opt/rocm/lib/libhsa-runtime64.so.1"),
        (-7, "python3[4242]: segfault at 8 ip 00007f sp 00007f error 4 in libamdhip64.so.6.2.60200[7f3a+2e1000]"),
    ],
)
def test_a_fatal_signal_in_a_frame_of_the_gpu_runtime_is_the_gpus_side_never_the_loaders(code, text):
    found = diagnose(Evidence(failure="crash", exit_code=code, stderr=text))
    assert found.cls == "gpu-fault" and "in the GPU runtime" in found.title and found.why
    # the same frames with no fatal signal, or a fatal signal in another library, decide nothing
    assert diagnose(Evidence(failure="crash", exit_code=1, stderr=text)).cls != "gpu-fault"
    opencv = "#0 0x7f in cv::imread from libopencv_imgcodecs.so"
    assert diagnose(Evidence(failure="crash", exit_code=-11, stderr=opencv)).cls == "unknown"


# A real process, a real faulthandler dump and torch's real torch/cuda/__init__.py: the runtime's count of the GPUs
# (torch._C._cuda_getDeviceCount, hipGetDeviceCount on ROCm) replaced by a call to address 0, as a broken runtime
# faults inside it; ``{where}`` is where Python stands when it faults.
_FAULT_IN = """
import ctypes, faulthandler, torch
faulthandler.enable(all_threads=True)
torch._C._cuda_getDeviceCount = ctypes.CFUNCTYPE(ctypes.c_int)(0)
def model_step():
    return torch._C._cuda_getDeviceCount()
{where}
"""


def _faulted(where: str) -> tuple[int, str]:
    env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _FAULT_IN.format(where=where)], capture_output=True, text=True, timeout=120, env=env
    )
    return done.returncode, done.stderr


def test_a_fatal_signal_in_torchs_first_call_into_the_gpu_runtime_is_the_environment():
    """strixhalo-toolbox61 (heldout3): a torch whose runtime faults as it starts dies by SIGSEGV at
    torch.cuda.is_available(), with no word. The trainer's faulthandler says where Python stood: there, the installed
    runtime cannot start on this machine (stop at once, exit 4), not a loader to lighten."""
    code, stderr = _faulted("torch.cuda.is_available()")
    assert code == -11, stderr
    found = diagnose(Evidence(failure="crash", exit_code=code, stderr=stderr))
    assert found.cls == ENVIRONMENT and "as the GPU runtime started" in found.title and found.why, found
    # the same fault from another frame (a model's step calling the runtime), or with no dump, decides nothing
    code, elsewhere = _faulted("model_step()")
    assert code == -11 and "in model_step" in elsewhere
    assert diagnose(Evidence(failure="crash", exit_code=code, stderr=elsewhere)).cls == UNKNOWN
    assert diagnose(Evidence(failure="crash", exit_code=-11, stderr="")).cls == UNKNOWN
