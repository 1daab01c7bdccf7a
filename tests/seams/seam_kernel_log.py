"""Test seam: a fake kernel log for the watchdog, in tests only.

With ``tests/seams`` on ``PYTHONPATH`` and ``ROCM_YOLO_TEST_KERNEL_LOG=FILE``, every
:class:`rocm_yolo.supervisor.config.WatchdogConfig` made in a process (the real CLI's supervisor)
reads ``FILE`` as the kernel log, as if ``kernel_log=FILE`` had been given: the config's own field,
which production leaves unset (the system's log: /dev/kmsg, dmesg, journalctl). A test writes the
amdgpu or OOM-killer lines into ``FILE``, each with its wall-clock time (``journalctl -o short-unix``'s
format: ``1764000000.123 host kernel: ...``), and the supervisor reads them when a failure comes.

The package never imports this module. It lives in ``tests/seams`` only, beside the DDP seam.
"""

from __future__ import annotations

import os

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


PATCHES = {CONFIG: _patch}


def active() -> bool:
    return bool(os.environ.get(ENV))
