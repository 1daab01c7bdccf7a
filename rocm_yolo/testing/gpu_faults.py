"""What the GPU's failures look like, imitated in the trainer for :mod:`.faults`: the runtimes' own words (the HSA
runtime's page-fault line, torch's HIP error and out-of-memory messages) and two real failures of torch's own code
(a loss with a class index far out of range; a fault inside torch's first call into the runtime)."""

from __future__ import annotations

import os

HSA_FAULT_LINE = (
    "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000. "
    "Reason: Page not present or supervisor privilege.\n"
)  # the HSA runtime's words (ROCR-Runtime), before it calls abort()
HANDLED_HIP_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "probe.py", line 12, in <module>\n'
    "    torch.ones(1, device='cuda') + 1\n"
    "RuntimeError: HIP error: invalid device function\n"
    "HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing AMD_SERIALIZE_KERNEL=3\n"
    "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.\n"
    "(handled: training goes on)\n"
)  # torch's own words for a HIP error, as a caught exception's traceback prints them
OOM_MESSAGE = (
    "HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.98 GiB of which 1.02 GiB is "
    "free. Of the allocated memory 5.91 GiB is allocated by PyTorch, and 312.00 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def device_assert(device) -> None:
    """``device-assert``: a cross-entropy loss on ``device`` whose target is a class index far out of range (class
    2**40 of 2). On an NVIDIA GPU the loss kernel's bounds check fails: a device-side assert, which leaves the
    process's GPU context unusable. ROCm's torch builds have kernel asserts off, so there the read 4 TiB past the
    tensor is what fails (a memory access fault). On the CPU torch raises ``IndexError``. ``.item()`` waits for
    the GPU, so the error surfaces here."""
    import torch
    import torch.nn.functional as F

    logits = torch.zeros(1, 2, device=device)
    target = torch.tensor([1 << 40], device=device)
    F.cross_entropy(logits, target).item()


def runtime_start_fault() -> None:
    """What a broken GPU runtime does as torch starts it (strixhalo-toolbox61: SIGSEGV inside hipGetDeviceCount, no
    word): the runtime's count of the GPUs (``torch._C._cuda_getDeviceCount``) becomes a call to address 0, then
    torch's own ``torch.cuda.is_available()`` calls it; the process dies by SIGSEGV in native code, as a broken
    ``libhsa-runtime64`` kills it."""
    import ctypes

    import torch

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "0"  # is_available asks the runtime, not NVML
    torch._C._cuda_getDeviceCount = ctypes.CFUNCTYPE(ctypes.c_int)(0)
    torch.cuda.is_available()
