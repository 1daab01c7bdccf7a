"""The tests' seams, loaded at start-up by every Python process that has ``tests/seams`` on ``PYTHONPATH``.

Python imports only the first ``sitecustomize`` on its path, so the seams share this one: each is a module beside
it, active when its environment variable is set, with the Ultralytics or rocm-yolo modules it changes and how.

- :mod:`seam_cpu_ddp` (``ROCM_YOLO_TEST_CPU_DDP=1``): Ultralytics' multi-GPU (DDP) training on CPU ranks with
  gloo; ``kfd/nodes`` beside it is a machine of two GPUs for ``ROCM_YOLO_KFD_ROOT``;
- :mod:`seam_kernel_log` (``ROCM_YOLO_TEST_KERNEL_LOG=FILE``): the watchdog reads a test's file as the kernel log;
- :mod:`seam_roots` (``ROCM_YOLO_TEST_PROC_ROOT=DIR``, ``ROCM_YOLO_TEST_CGROUP_ROOT=DIR``): the watchdog reads a test's
  folders as ``/proc`` and ``/sys/fs/cgroup``.

Each patch runs right after its module is executed, wherever that module is first imported. The package never
imports any of this: it lives in ``tests/`` only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

import seam_cpu_ddp
import seam_kernel_log
import seam_roots

SEAMS = (seam_cpu_ddp, seam_kernel_log, seam_roots)


class _Finder(importlib.abc.MetaPathFinder):
    """Runs each active seam's patches of a module right after the module is executed."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        patches = self.patches.get(name)
        if not patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            for patch in patches:
                patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    patches: dict = {}
    for seam in SEAMS:
        if seam.active():
            for name, patch in seam.PATCHES.items():
                patches.setdefault(name, []).append(patch)
    if patches and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(patches))


install()
