"""How many GPUs this machine shows a run, found before any rank starts and without importing torch here.

On an AMD machine the KFD topology in sysfs lists the GPUs (:func:`rocm_yolo.gpu.arch.detect_gpus`),
and the ROCm runtime shows a process only those its visibility variables keep
(``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES``, each a list that
narrows the one before). A machine with no GPU runtime's device file (``/dev/kfd``, ``/dev/nvidiactl``) has
none. Elsewhere (an NVIDIA card, or a topology this cannot read) a bounded probe asks torch in a
throwaway process. Either way the answer comes in seconds, so a ``--device`` that names GPUs the
machine does not have is refused before the run starts.
"""

from __future__ import annotations

import os
from typing import Mapping

from rocm_yolo.gpu.arch import GpuNode, detect_gpus
from rocm_yolo.process.tree import python, run_bounded

VISIBILITY = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# The device files a GPU runtime opens to reach a GPU: AMD's KFD (ROCm), NVIDIA's control device (CUDA), WSL's GPU
# paravirtualization (both, under Windows). Without any of them torch sees no GPU, and no probe needs to ask it.
DEVICE_FILES = ("/dev/kfd", "/dev/nvidiactl", "/dev/dxg")
PROBE = "import torch; print(torch.cuda.device_count())"


def visible_in_topology(env: Mapping[str, str] = os.environ, root=None) -> int | None:
    """The GPUs of the KFD topology a process here may use; None when the topology shows no AMD GPU."""
    count = len(detect_gpus(root))
    if not count:
        return None
    for var in VISIBILITY:
        if var in env:
            count = min(count, len([x for x in env[var].split(",") if x.strip()]))
    return count


def used_gpus(gpus: list[GpuNode], ids: list[str] | None, env: Mapping[str, str] = os.environ) -> list[GpuNode]:
    """The GPUs of the topology a run on the device ids ``ids`` uses (``[]``: Ultralytics' default, GPU 0; ``None``:
    no GPU, the CPU): each visibility variable picks from what the one before left. A list this cannot follow
    (UUIDs) leaves every GPU it could mean."""
    if ids is None:
        return []
    shown = list(gpus)
    for var in VISIBILITY:
        picks = [x.strip() for x in env.get(var, "").split(",") if x.strip()] if var in env else None
        if picks is None:
            continue
        if not all(x.isdigit() for x in picks):
            return shown
        shown = [shown[int(x)] for x in picks if int(x) < len(shown)]
    return [shown[int(i)] for i in (ids or ["0"]) if int(i) < len(shown)]


def probe(timeout: float = 60.0) -> int | None:
    """``torch.cuda.device_count()`` in a throwaway process (ROCm builds answer for HIP); None if it cannot tell."""
    outcome = run_bounded(python("-c", PROBE), timeout)
    last = (outcome.stdout.strip().splitlines() or [""])[-1]
    return int(last) if outcome.returncode == 0 and last.isdigit() else None


def device_files() -> list[str]:
    """The GPU runtimes' device files this machine has (:data:`DEVICE_FILES`)."""
    return [f for f in DEVICE_FILES if os.path.exists(f)]


def visible_gpus(env: Mapping[str, str] = os.environ, root=None, timeout: float = 60.0) -> int | None:
    """How many GPUs a run here can use: the topology; else none, where no GPU runtime has a device file here; else
    torch's answer. None when nothing can tell."""
    found = visible_in_topology(env, root)
    if found is not None:
        return found
    return probe(timeout) if device_files() else 0
