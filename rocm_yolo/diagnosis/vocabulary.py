"""The runtimes' own words for what failed: HIP, the HSA runtime (ROCr) and ROCclr, MIOpen, rocBLAS, NCCL/RCCL,
PyTorch and Linux, each pattern with the source that prints it and the class it means.

The classifier (:mod:`.diagnose`) reads a failure's text against :data:`WORDS`, in their order: the first word
that appears decides. A pattern is a runtime's error name, its error string
(``hipGetErrorString``, ``hsa_status_string``, ``ncclGetErrorString``, torch's message) or the format of a line it
prints, never one user's output: so a failure nobody reported yet is named by the same words. :data:`WAITS` holds
where a hung thread waits in the runtime's native frames (read in a hang only, by :mod:`.hangs`).

Why this order: what a runtime says of the card itself (no code object for it, no device) explains every later
error, memory refused explains a kernel's or a worker's death, the GPU's own fault explains a collective or a
loader that fails after it, and a collective's timeout explains the ranks' other errors.

Torch-free and pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rocm_yolo.diagnosis import classes
from rocm_yolo.diagnosis.classes import (
    COLLECTIVE,
    DATA_ERROR,
    ENVIRONMENT,
    GPU_FAULT,
    GPU_HANG,
    GPU_OOM,
    HOST_OOM,
    LOADER,
    TRAINING_ERROR,
    FailureClass,
)

NCCL_SHM = "NCCL shared-memory segment"  # a collective's word whose remedy is its own (diagnosis.remedies)


@dataclass(frozen=True)
class Word:
    """One thing a runtime says, what it means, and where it says it."""

    failure: FailureClass  # the class it means (its record)
    name: str  # how rocm-yolo names it: "hipErrorNoBinaryForGpu"
    pattern: re.Pattern
    source: str  # the runtime's source that prints it
    meaning: str = ""  # what it says of the failure, in a few words

    @property
    def cls(self) -> str:
        """The name of the class it means."""
        return self.failure.name


def _w(cls: str, name: str, pattern: str, source: str, meaning: str = "", flags: int = 0) -> Word:
    return Word(classes.named(cls), name, re.compile(pattern, flags), source, meaning)


HIP_ERRORS = "ROCm/clr hipamd/src/hip_error.cpp (hipGetErrorString), printed by torch as 'HIP error: ...'"
HSA_STATUS = "ROCm/ROCR-Runtime hsa.h and hsa_ext_amd.h (hsa_status_string)"
ROCCLR_ABORT = "ROCm/clr rocclr/device/rocm/rocdevice.cpp and rocvirtual.cpp: 'Callback: Queue ... aborting with error'"
ROCR_FAULT = "ROCm/ROCR-Runtime runtime/hsa-runtime/core/runtime/runtime.cpp (VMFaultHandler, HwExceptionHandler)"
TORCH_CUDA = "pytorch/pytorch c10/cuda/CUDAException.h and torch/cuda/__init__.py (hipified on ROCm)"
TORCH_ALLOC = "pytorch/pytorch c10/core/impl/alloc_cpu.cpp (DefaultCPUAllocator)"
TORCH_NCCL = "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (the NCCL watchdog)"
NCCL_ERRORS = "NVIDIA/nccl and ROCm/rccl src/misc/utils.cc (ncclGetErrorString)"
TORCH_LOADER = "pytorch/pytorch torch/utils/data/dataloader.py and _utils/signal_handling.py"
TORCH_WORKER = "pytorch/pytorch torch/csrc/DataLoader.cpp (a worker's fatal-signal handler)"
MIOPEN = "ROCm/MIOpen src/include/miopen/errors.hpp, src/hipoc/hipoc_program.cpp (MIOpen Error, hiprtc builds)"
ROCBLAS = "ROCm/rocBLAS library/src/tensile_host.cpp (the Tensile kernel library for the card)"
HIP_FATBIN = "ROCm/clr hipamd/src/hip_fatbin.cpp and hip_code_object.cpp (no code object for the device)"
LINUX_ENOMEM = "Linux errno ENOMEM ('Cannot allocate memory'), C++ std::bad_alloc, CPython MemoryError"
OPENCV = "opencv/opencv modules/core/src/alloc.cpp (OutOfMemoryError: 'Failed to allocate N bytes')"
TORCH_DEVICES = (
    'pytorch/pytorch c10/cuda/CUDAFunctions.cpp (device_count: TORCH_WARN("CUDA initialization: ", ...) with the '
    "error of device_count_impl, the runtime's failure to count the GPUs; 'HIP initialization:' hipified)"
)
HIP_LAUNCH_BOUNDS = (
    "ROCm/clr hipamd/src/hip_module.cpp:295 (f9f995c6, the launch's validation: more threads per block than the "
    "kernel's code object allows returns hipErrorLaunchFailure)"
)
HIP_OLD_CODES = (
    "ROCm/HIP include/hip/hip_runtime_api.h: hipErrorMemoryAllocation = 1002 until Dec 2019 (line 253 at 9c916321), "
    "then the deprecated alias of hipErrorOutOfMemory = 2 (line 293 at c5e11fca); a caller that prints the code's "
    "value shows hipError_t(1002)"
)
TORCH_TH_ALLOC = (
    "pytorch/pytorch aten/src/TH/THGeneral.cpp (THAlloc, torch 1.x and Torch7: '$ Torch: not enough memory: you "
    "tried to allocate ...GB')"
)
TORCH_NCCL_FRAMES = (
    "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (WorkNCCL::checkTimeout raises 'Watchdog caught "
    "collective operation timeout'; the watchdog thread ncclCommWatchdog raises what it caught), as c10's "
    "'Exception raised from <function> at <file>' (c10/util/Exception.cpp) and its C++ frames show them"
)
ROCR_WAIT = (
    "ROCm/ROCR-Runtime runtime/hsa-runtime/core/runtime/interrupt_signal.cpp:144 and :245 (c7785a6d: "
    "rocr::core::InterruptSignal::WaitRelaxed/WaitAcquire, which sleep in hsaKmtWaitOnEvent_Ext, :241), "
    "default_signal.cpp:78 (BusyWaitSignal), inc/hsa.h:2062 (hsa_signal_wait_scacquire): a host thread waits for "
    "a signal the GPU sets when its work is done"
)
GPU_LIBRARIES = (
    "the GPU runtime's shared libraries as ROCm and CUDA install them: ROCm/clr CMakeLists.txt (amdhip64), "
    "ROCm/ROCR-Runtime (hsa-runtime64, hsakmt), ROCm/llvm-project amd/comgr (amd_comgr), ROCm/rocBLAS, ROCm/MIOpen, "
    "ROCm/hipBLASLt, ROCm/rccl; NVIDIA's libcuda (the driver), libcudart, libnvrtc, libnccl; the kernel's segfault "
    "line (arch/x86/mm/fault.c show_signal_msg: 'segfault at ADDR ip IP sp SP error N in LIB[...]')"
)
GLOO_PAIR = (
    "pytorch/gloo gloo/transport/tcp/pair.cc (Pair::handleReadWrite, signalException: 'Connection closed by peer', "
    "'Timed out waiting ... for recv'), raised in the rank by torch's ProcessGroupGloo"
)
CUDNN = "NVIDIA cuDNN's cudnnGetErrorString (CUDNN_STATUS_*), printed by torch's aten/src/ATen/cudnn/Exceptions.h"
ULTRALYTICS_DATA = "ultralytics/ultralytics ultralytics/data (load_image, verify_image_label, the label checks)"

WORDS: tuple[Word, ...] = (
    # --- the installed software cannot run on this card
    _w(
        ENVIRONMENT,
        "hipErrorNoBinaryForGpu",
        r"hipErrorNoBinaryForGpu[^\n]*",
        HIP_FATBIN,
        "no code object for this card",
    ),
    _w(
        ENVIRONMENT,
        "no kernel image for the device",
        r"no kernel image is available for execution on the device",
        HIP_ERRORS,
        "hipErrorNoBinaryForGpu: no kernels for this card",
    ),
    _w(
        ENVIRONMENT,
        "invalid device function",
        r"invalid device function|hipErrorInvalidDeviceFunction",
        HIP_ERRORS,
        "hipErrorInvalidDeviceFunction: the kernel was not built for this card",
    ),
    _w(
        ENVIRONMENT,
        "invalid kernel image",
        r"device kernel image is invalid|hipErrorInvalidImage|invalid kernel file|hipErrorInvalidKernelFile|"
        r"Cannot retrieve Static function[^\n]*",
        HIP_ERRORS + "; ROCm/clr hipamd/src/hip_platform.cpp (a kernel its code object cannot give)",
        "no usable code object for this card",
    ),
    _w(
        ENVIRONMENT,
        "kernel built for fewer threads",
        r"Launch params \(\d+, \d+, \d+\) are larger than launch bounds \(\d+\)[^\n]*",
        HIP_LAUNCH_BOUNDS,
        "a kernel launched with more threads per block than its code object was built for: a build that does not "
        "fit this card (its wave size)",
    ),
    _w(
        ENVIRONMENT,
        "no GPU visible",
        r"No (?:HIP|CUDA) GPUs are available|no (?:ROCm|CUDA)-capable device is detected|hipErrorNoDevice|"
        r"Torch not compiled with CUDA enabled|CUDA driver initialization failed|(?:CUDA|HIP) initialization: [^\n]*",
        TORCH_CUDA + " (_lazy_init: a torch built without a GPU); " + TORCH_DEVICES + "; " + HIP_ERRORS,
        "the runtime sees no usable GPU (driver, permissions, visibility variables, or an unsupported card)",
    ),
    _w(
        ENVIRONMENT,
        "driver too old",
        r"driver version is insufficient for runtime version|hipErrorInsufficientDriver|Found no NVIDIA driver",
        HIP_ERRORS,
    ),
    _w(
        ENVIRONMENT,
        "shared object initialization failed",
        r"shared object initialization failed|hipErrorSharedObjectInitFailed",
        HIP_ERRORS,
    ),
    _w(
        ENVIRONMENT,
        "HSA code object refused",
        r"HSA_STATUS_ERROR_(?:INVALID_ISA(?:_NAME)?|INVALID_CODE_OBJECT)\b[^\n]*|"
        r"Agent creation failed\.?\s*The GPU node has an unrecognized id[^\n]*|HSA_OVERRIDE_GFX_VERSION \S+ is invalid",
        HSA_STATUS + "; ROCm/ROCR-Runtime amd_gpu_agent.cpp; libhsakmt topology.c (the override)",
        "the code object's instruction set is not this card's (or the override names no ISA)",
    ),
    _w(
        ENVIRONMENT,
        "rocBLAS has no kernels for the card",
        r"rocBLAS error: (?:Cannot read|Could not load|Could not initialize Tensile)[^\n]*|"
        r"rocblas_status_(?:arch_mismatch|excluded_from_build)",
        ROCBLAS,
        "no Tensile kernel library for this card's architecture",
    ),
    _w(
        ENVIRONMENT,
        "MIOpen cannot build its kernels",
        r"MIOpen(?:\(HIP\))?: Error \[(?:Compile|BuildHip|BuildOcl|SetIsaName)\][^\n]*|HIPRTC_ERROR_COMPILATION[^\n]*|"
        r"Code object build failed[^\n]*|No suitable algorithm was found to execute the required convolution[^\n]*",
        MIOPEN + "; src/ocl/convolutionocl.cpp",
        "MIOpen cannot build or find a convolution kernel for this card",
    ),
    _w(
        ENVIRONMENT,
        "the GPU compiler crashed",
        r"Program arguments: \S*(?:llc|clang|ld\.lld|amdgpu-\S+)\b[^\n]*amdgcn[^\n]*",
        "llvm/llvm-project's crash report (PrettyStackTrace: 'Program arguments:') in MIOpen/HIP's runtime compiles",
        "the AMDGPU compiler crashed building a kernel for this card at run time",
    ),
    _w(
        ENVIRONMENT,
        "PCIe atomics missing",
        r"Pcie atomics not enabled[^\n]*|the operation cannot be performed in the present state|hipErrorIllegalState",
        "ROCm/clr rocclr/device/rocm/rocvirtual.cpp; " + HIP_ERRORS,
        "the slot or CPU gives the GPU no PCIe atomics, which ROCm's hostcall kernels need",
    ),
    # --- GPU memory
    _w(
        GPU_OOM,
        "GPU out of memory",
        r"(?:HIP|CUDA) out of memory[^\n]*|OutOfMemoryError: [^\n]*|"
        r"hipErrorOutOfMemory|(?:HIP|CUDA) error: out of memory|miopenStatusAllocFailed|MIOPEN_STATUS_ALLOC_FAILED|"
        r"(?:CU|HIP)BLAS_STATUS_ALLOC_FAILED|rocblas_status_memory_error|Allocation failed : Device memory[^\n]*|"
        r"BlockAllocator::alloc failed[^\n]*|HSA_STATUS_ERROR_OUT_OF_(?:RESOURCES|REGISTERS)\b[^\n]*|"
        r"Memory not available to allocate buffer[^\n]*|hipErrorMemoryAllocation|hipError_t\((?:2|1002)\)",
        TORCH_CUDA
        + "; "
        + HIP_ERRORS
        + "; "
        + MIOPEN
        + "; "
        + HSA_STATUS
        + " (OUT_OF_RESOURCES: scratch, queues, VRAM); "
        + HIP_OLD_CODES,
    ),
    # --- host memory
    _w(
        HOST_OOM,
        "host memory refused",
        r"DefaultCPUAllocator: (?:can't allocate|not enough) memory[^\n]*|"
        r"^\W*(?:[\w.]+\.)?(?:_Array)?MemoryError\b[^\n]*|"
        r"std::bad_alloc|\[Errno 12\] Cannot allocate memory[^\n]*|Insufficient memory\)? Failed to allocate[^\n]*|"
        r"CPUAllocator\.cpp:\d+\][^\n]*posix_memalign[^\n]*|\$ Torch: not enough memory: you tried to allocate[^\n]*|"
        r"Detected \d+ oom[_-]kill event[^\n]*|Some of the step tasks have been OOM Killed[^\n]*|"
        r"earlyoom\S*: (?:low memory!|sending SIG\w+ to process)[^\n]*|systemd-oomd\S*: Killed[^\n]*",
        TORCH_ALLOC
        + " (older: CPUAllocator.cpp's posix_memalign); "
        + TORCH_TH_ALLOC
        + "; "
        + LINUX_ENOMEM
        + "; "
        + OPENCV
        + "; "
        "SchedMD/slurm src/plugins/task/cgroup (slurmstepd: the step's cgroup OOM-killed a task); "
        "rfjakob/earlyoom and systemd-oomd (user-space OOM killers: SIGTERM, then SIGKILL)",
        flags=re.M,
    ),
    # --- a kernel's own check of the step's data
    _w(
        TRAINING_ERROR,
        "device-side assert",
        r"device-side assert(?:ion)? triggered[^\n]*|hipErrorAssert|[Dd]evice-side assertion `[^\n]*' failed[^\n]*|"
        r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `[^\n]*` failed[^\n]*",
        HIP_ERRORS + "; pytorch/pytorch c10/macros/Macros.h (CUDA_KERNEL_ASSERT: 'Device-side assertion ... failed'); "
        "the CUDA runtime's device assert ('block: [..], thread: [..] Assertion ... failed.')",
        "a kernel's check of the step's own data failed (an index out of range): not the GPU's fault",
    ),
    # --- the GPU faulted or hung (the runtime's last words)
    _w(
        GPU_HANG,
        "GPU hang",
        r"HW Exception by GPU node-\d+[^\n]*reason\s*:\s*GPU Hang[^\n]*|"
        r"Memory access fault by GPU node-\d+[^\n]*Reason: Generic hang recovery[^\n]*",
        ROCR_FAULT,
        "the GPU was reset after it hung: every queue of the process is gone",
        re.I,
    ),
    _w(
        GPU_FAULT,
        "memory access fault",
        r"Memory access fault by GPU node-\d+[^\n]*",
        ROCR_FAULT,
        "a kernel touched memory it may not",
    ),
    _w(GPU_FAULT, "hardware exception", r"HW Exception by GPU node-\d+[^\n]*", ROCR_FAULT),
    _w(
        GPU_FAULT,
        "the HSA runtime aborted",
        r"(?i:aborting with error) : HSA_STATUS_ERROR\w*[^\n]*|HSA_STATUS_ERROR_(?:MEMORY_APERTURE_VIOLATION|"
        r"MEMORY_FAULT|EXCEPTION|ILLEGAL_INSTRUCTION|FATAL)\b[^\n]*",
        ROCCLR_ABORT + "; " + HSA_STATUS,
        "the GPU's queue stopped on an error",
    ),
    _w(GPU_FAULT, "memory exception", r"Memory exception on virtual address[^\n]*", ROCR_FAULT),
    _w(
        GPU_HANG,
        "kernel launch timed out",
        r"the launch timed out and was terminated|hipErrorLaunchTimeOut",
        HIP_ERRORS,
    ),
    _w(
        GPU_FAULT,
        "illegal memory access",
        r"an illegal memory access was encountered|hipErrorIllegalAddress|unspecified launch failure|"
        r"hipErrorLaunchFailure|uncorrectable ECC error encountered|hipErrorECCNotCorrectable|[DS]RAM ECC failure|"
        r"an illegal instruction was encountered|hipErrorIllegalInstruction|(?:CUDA|HIP) error: misaligned address|"
        r"hipErrorMisalignedAddress|(?:CUDA|HIP) error: invalid program counter|hipErrorInvalidPc",
        HIP_ERRORS,
    ),
    _w(GPU_FAULT, "MIOpen error", r"MIOpen Error:[^\n]*|miopenStatus(?!Success)\w+", MIOPEN),
    _w(GPU_FAULT, "cuDNN error", r"cuDNN error: [^\n]*|CUDNN_STATUS_(?!SUCCESS)\w+", CUDNN),
    _w(GPU_FAULT, "rocBLAS error", r"rocBLAS error:[^\n]*|rocblas_status_(?!success)\w+", ROCBLAS),
    _w(
        GPU_FAULT,
        "HIP error",
        r"(?:(?:HIP|CUDA) error: [^\n]*|\b(?:hip|cuda)Error(?!Success)\w+)",
        HIP_ERRORS + "; the CUDA runtime's cudaGetErrorString and cudaGetErrorName (torch: 'CUDA error: ...')",
    ),
    # --- the GPUs' collectives
    _w(
        COLLECTIVE,
        NCCL_SHM,
        r"Error while (?:creating|attaching to) shared memory segment[^\n]*",
        "NVIDIA/nccl and ROCm/rccl src/misc/shmutils.cc (ncclShmOpen: the segment in /dev/shm that the ranks of one "
        "machine share)",
        "/dev/shm has no room for the collectives' shared-memory transport",
    ),
    _w(
        COLLECTIVE,
        "collective timed out",
        r"[Cc]aught collective operation timeout[^\n]*|(?:NCCL|Process group) watchdog thread terminated[^\n]*|"
        r"ProcessGroupNCCL's watchdog got stuck[^\n]*|Some NCCL operations have failed or timed out[^\n]*|"
        r"Heartbeat monitor timed out[^\n]*|NCCL operation timed out|"
        r"\bWorkNCCL::checkTimeout\b[^\n]*|Exception raised from checkTimeout at \S*ProcessGroupNCCL\.cpp[^\n]*",
        TORCH_NCCL + "; " + TORCH_NCCL_FRAMES,
        "a collective waited longer than its timeout: a rank stopped taking part",
    ),
    _w(
        COLLECTIVE,
        "NCCL/RCCL error",
        r"(?:NCCL|RCCL) (?:error|Error)[^\n]*|nccl(?:UnhandledCudaError|SystemError|InternalError|RemoteError)"
        r"[^\n]*|DistBackendError[^\n]*|NCCL communicator was aborted[^\n]*|"
        r"unhandled (?:cuda|system) error \(run with NCCL_DEBUG[^\n]*|"
        r"remote process exited or there was a network error|"
        r"NCCL WARN (?:(?:Cuda|HIP|HSA) failure|Call to \S+ failed)[^\n]*|"
        r"Exception raised from ncclCommWatchdog at \S*ProcessGroupNCCL\.cpp[^\n]*",
        NCCL_ERRORS + "; " + TORCH_NCCL + "; " + TORCH_NCCL_FRAMES,
    ),
    _w(
        COLLECTIVE,
        "gloo's connection to another rank lost",
        r"gloo/transport/tcp/(?:pair|unbound_buffer)\.cc:\d+\][^\n]*(?:Connection closed by peer|Connection reset by "
        r"peer|Timed out waiting)[^\n]*",
        GLOO_PAIR,
        "a rank's gloo connection to another closed or timed out: the other rank (or its node) went away",
    ),
    # --- the loader's processes and their shared memory
    _w(
        LOADER,
        "DataLoader worker died",
        r"DataLoader worker \(pid[^\n]*|DataLoader timed out after[^\n]*|"
        r"Unexpected (?:bus error|segmentation fault) encountered in worker[^\n]*|"
        r"unable to (?:write to file|open shared memory object) </torch_[^\n]*|out of shared memory[^\n]*|"
        r"received \d+ items of ancdata[^\n]*|Too many open files[^\n]*Communication with the workers[^\n]*|"
        r"Unexpected floating-point exception encountered in worker[^\n]*|Pin memory thread exited unexpectedly|"
        r"Cannot re-initialize (?:CUDA|HIP) in forked subprocess[^\n]*|\[Errno 24\] Too many open files[^\n]*|"
        r"An attempt has been made to start a new process before the\s+current process has finished its "
        r"bootstrapping phase",
        TORCH_LOADER + "; " + TORCH_WORKER + "; EMFILE: the workers' tensors shared as file descriptors; "
        "CPython Lib/multiprocessing/spawn.py (_check_not_importing_main: workers started while the main module "
        "is imported, without an `if __name__ == '__main__':` guard)",
    ),
    # --- the data
    _w(
        DATA_ERROR,
        "a sample failed to load",
        r"Image Not Found[^\n]*|cv2\.error[^\n]*|UnidentifiedImageError[^\n]*|cannot identify image file[^\n]*|"
        r"image file is truncated[^\n]*|Label class \d+ exceeds[^\n]*|Caught \w+ in DataLoader worker process[^\n]*|"
        r"PIL/(?:\w+ImagePlugin|ImageFile)\.py[^\n]*|ignoring corrupt image/label[^\n]*|"
        r"FileNotFoundError:\s*Dataset '[^'\n]*'(?: images)? not found[^\n]*|'(?:train|val|test):' images not found ❌",
        ULTRALYTICS_DATA
        + " and ultralytics/data/utils.py (check_det_dataset raises a split's images missing: its warnings of the "
        "same words, before a download or a split, are not failures); "
        + TORCH_LOADER
        + " (an exception raised by the dataset in a worker); "
        "python-pillow/Pillow's decoders (ImageFile, *ImagePlugin: a file that does not decode)",
    ),
    # --- the training step's own guard against a loss gone bad
    _w(
        TRAINING_ERROR,
        "loss not finite",
        r"(?i:FloatingPointError)[^\n]*|Loss became infinite or NaN[^\n]*",
        "CPython's FloatingPointError; facebookresearch/detectron2 engine/train_loop.py",
        "the loss became NaN or infinite",
    ),
)

# Where a hung thread waits, in its native frames (py-spy --native's, gdb's): read in a hang only (diagnosis.hangs), and
# in the main thread only: the HIP runtime's own threads wait on signals all the time (ROCclr's hostcall listener
# waits on its doorbell signal, rocclr/device/devhostcall.cpp)
WAITS: tuple[Word, ...] = (
    _w(
        GPU_HANG,
        "waits for the GPU's signal",
        r"\brocr::core::\w*Signal::Wait\w*|\bhsa_signal_wait_\w+",
        ROCR_WAIT,
        "the main thread waits for a signal the GPU never set: the GPU stopped answering",
    ),
)

# Where a process killed by a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) faulted, in a native frame of
# its output: gdb's "#0 ... in ... from/at LIB", the kernel's "segfault at ... in LIB[...]". Read only for such a
# death with no word of its own (diagnosis.diagnose): a fault inside the GPU runtime's libraries is the GPU's side.
FAULT_FRAMES: tuple[Word, ...] = (
    _w(
        GPU_FAULT,
        "a fault inside the GPU runtime's libraries",
        r"\blib(?:amdhip64|hsa-runtime64|hsakmt|amd_comgr|rocblas|MIOpen|hipblaslt|rccl|cuda|cudart|nvrtc|nccl)"
        r"\.so(?:\.\d+)*\b",
        GPU_LIBRARIES,
        "the process faulted in a native frame of the GPU runtime (HIP, HSA, the KFD's thunk, the code-object "
        "loader, rocBLAS, MIOpen, RCCL, CUDA): the GPU's side, never the loader's",
    ),
)

TORCH_GPU_START = (
    "pytorch/pytorch torch/cuda/__init__.py (hipified on ROCm): is_available and device_count ask the runtime for "
    "the GPUs (torch._C._cuda_getDeviceCount: hipGetDeviceCount, which starts HSA), _lazy_init and init start it "
    "(torch._C._cuda_init), the amdsmi and NVML counts start those libraries (amdsmi_init, nvmlInit); the frame as "
    "Python's faulthandler writes it (Modules/faulthandler.c: 'Current thread 0x... (most recent call first):' or "
    "'Stack (most recent call first):', then '  File \"...\", line N in FUNCTION', the innermost first)"
)

# Where a process killed by a fatal signal was in Python when it faulted: the innermost frame of the faulting thread
# in faulthandler's dump (the trainer enables it), read as :func:`faulting_frame` gives it, only for such a death with
# no word of its own and no native frame of the GPU runtime's libraries (diagnosis.diagnose).
START_FRAMES: tuple[Word, ...] = (
    _w(
        ENVIRONMENT,
        "the GPU runtime faulted as it started",
        r"[/\\]torch[/\\]cuda[/\\]__init__\.py\", line \d+ in (?:is_available|device_count|_lazy_init|init"
        r"|_raw_device_count_amdsmi|_device_count_amdsmi|_raw_device_uuid_amdsmi|_raw_device_count_nvml"
        r"|_device_count_nvml|_raw_device_uuid_nvml)$",
        TORCH_GPU_START,
        "the process faulted in torch's first call into the GPU runtime (counting or starting the GPUs), before any "
        "work on a GPU: the installed runtime cannot start on this machine (a broken or mismatched build, a card it "
        "does not support)",
    ),
)

_FAULTING = re.compile(
    r"^(?:Current thread 0x[0-9a-f]+|Stack) \(most recent call first\):\n\s*(File \"[^\"\n]+\", line \d+ in \S+)$",
    re.M,
)


def faulting_frame(text: str) -> str | None:
    """The innermost Python frame of the thread that faulted, as faulthandler wrote it (``File "PATH", line N in
    FUNCTION``); None when ``text`` holds no such dump. The last dump is the death's (an earlier one, a stack-dump
    signal's, goes to the run's stacks/ folder)."""
    found = _FAULTING.findall(text)
    return found[-1] if found else None


# the GPU runtime's own words (HIP, HSA, MIOpen, rocBLAS, CUDA): before training, an exception that holds one is the
# environment's (rocm_yolo.triage)
GPU_RUNTIME: tuple[Word, ...] = tuple(word for word in WORDS if word.failure.gpu_runtime)

# Line prefixes that launchers, quoting and logging put before a runtime's words: torch.distributed.run's
# "[rank0]: ", mpirun's "[1,0]<stderr>:", a quoted post's "> ", markdown emphasis.
_PREFIX = re.compile(r"^(?:\s*(?:\[rank\d+\]:|\[\d+,\d+\]<std(?:err|out)>:|>|\*\*|`)\s?)+", re.M)


def clean(text: str) -> str:
    """``text`` with the launchers' and quoting's line prefixes taken off (the runtimes' words start the line)."""
    return _PREFIX.sub("", text)


def first(text: str, words: tuple[Word, ...] = WORDS) -> tuple[Word, str] | None:
    """The first word of ``words`` that ``text`` holds, and the line it is on; None if it holds none."""
    for word in words:
        m = word.pattern.search(text)
        if m:
            end = text.find("\n", m.end())
            return word, text[text.rfind("\n", 0, m.start()) + 1 : end if end >= 0 else len(text)].strip()
    return None


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$")  # "torch.OutOfMemoryError: ..."


def last_exception(traceback: str) -> str:
    """The traceback's final ``Type: message`` line (a warning's ``path.py:55: UserWarning: ...`` is none)."""
    lines = [
        x
        for x in clean(traceback).splitlines()
        if x.strip() and not x.startswith((" ", "\t", "Traceback", "During", "The ", "^")) and _EXCEPTION_LINE.match(x)
    ]
    return lines[-1].strip() if lines else ""
