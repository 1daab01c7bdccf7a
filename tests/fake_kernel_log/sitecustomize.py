"""Test seam: a fake kernel log for the watchdog, in tests only.

With this directory on ``PYTHONPATH`` and ``ROCM_YOLO_TEST_KERNEL_LOG=FILE``, every
:class:`rocm_yolo.supervisor.config.WatchdogConfig` made in a process (the real CLI's supervisor)
reads ``FILE`` as the kernel log, as if ``kernel_log=FILE`` had been given: the config's own field,
which production leaves unset (the system's log: /dev/kmsg, dmesg, journalctl). A test writes the
amdgpu or OOM-killer lines into ``FILE``, each with its wall-clock time (``journalctl -o short-unix``'s
format: ``1764000000.123 host kernel: ...``), and the supervisor reads them when a failure comes.

The package never imports this module. It lives in ``tests/`` only (as ``tests/cpu_ddp`` does for DDP).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

ENV = "ROCM_YOLO_TEST_KERNEL_LOG"
CONFIG = "rocm_yolo.supervisor.config"


def line(text: str, when: float) -> str:
    """``text`` as a kernel log line written at ``when`` (wall clock)."""
    return f"{when:.6f} testhost kernel: {text}\n"


def _patch(module) -> None:
    cls = module.WatchdogConfig
    original = cls.__post_init__

    def __post_init__(self):
        original(self)
        if self.kernel_log is None:
            object.__setattr__(self, "kernel_log", os.environ[ENV])

    cls.__post_init__ = __post_init__


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the config module right after it is executed, wherever it is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != CONFIG:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if os.environ.get(ENV) and not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
