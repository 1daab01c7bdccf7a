"""Test seam: fake /proc and cgroup trees for the watchdog, in tests only.

With ``tests/seams`` on ``PYTHONPATH``, ``ROCM_YOLO_TEST_PROC_ROOT=DIR`` makes every
:class:`rocm_yolo.supervisor.config.WatchdogConfig` made in a process (the real CLI's supervisor) read ``DIR`` as
``/proc`` (``proc_root``: the kernel's view of a hung process's threads, the start-up's movement, the run's cgroup
in ``DIR/self/cgroup``), and ``ROCM_YOLO_TEST_CGROUP_ROOT=DIR`` read ``DIR`` as ``/sys/fs/cgroup``
(``cgroup_root``: the run's OOM-kill count and memory limit): the config's own fields, which production leaves
unset. A test writes the files the kernel would (``memory.events`` with its ``oom_kill`` count, a thread's
``wchan`` and ``syscall``) and changes them as the kernel would, around a real process it kills or hangs for real.

The package never imports this module. It lives in ``tests/seams`` only, beside the kernel log's seam.
"""

from __future__ import annotations

import os

PROC_ENV = "ROCM_YOLO_TEST_PROC_ROOT"
CGROUP_ENV = "ROCM_YOLO_TEST_CGROUP_ROOT"
CONFIG = "rocm_yolo.supervisor.config"


def _patch(module) -> None:
    cls = module.WatchdogConfig
    original = cls.__post_init__

    def __post_init__(self):
        original(self)
        for field, env in (("proc_root", PROC_ENV), ("cgroup_root", CGROUP_ENV)):
            if getattr(self, field) is None and os.environ.get(env):
                object.__setattr__(self, field, os.environ[env])

    cls.__post_init__ = __post_init__


PATCHES = {CONFIG: _patch}


def active() -> bool:
    return bool(os.environ.get(PROC_ENV) or os.environ.get(CGROUP_ENV))
