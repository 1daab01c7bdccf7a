"""``WatchdogConfig``: every watchdog setting and its default, defined once.

The CLI's flags, the Python API's arguments and the supervisor all read their defaults here,
and the values they give are checked here: a stall timeout of ``nan`` would switch the
watchdog off without a word (every comparison with it is false).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rocm_yolo.errors import UsageError, option
from rocm_yolo.policy.profiles import DEFAULT_LADDER
from rocm_yolo.run.supervisor_state import WatchdogSettings


@dataclass(frozen=True)
class WatchdogConfig:
    enabled: bool = True
    stall_timeout: float = 180.0  # floor, seconds
    step_multiplier: float = 10.0  # timeout is at least this many slowest recent steps
    startup_grace: float = 900.0  # before the first training batch of an attempt (scan, cache, kernel tuning)
    restart_startup_factor: float = 3.0  # a restart's allowance: this many times the run's own first start-up
    max_restarts: int = 3
    ladder: tuple[str, ...] = DEFAULT_LADDER
    poll_interval: float = 0.5
    term_timeout: float = 8.0
    kill_timeout: float = 4.0
    gpu_release_timeout: float = 50.0  # after a GPU fault or hang: wait this long at most for the GPU (as NVRx)
    notify: str | None = None  # a shell command run for each event of the run, the event as JSON on its stdin
    notify_timeout: float = 30.0  # a notify command still running after this is killed
    notify_grace: float = 5.0  # the run's last event: this long to be delivered before the command is killed
    kernel_log: str | None = None  # a file read as the kernel log instead of the system's (tests set it)
    proc_root: str | None = None  # a folder read as /proc instead of the system's (tests set it)
    cgroup_root: str | None = None  # a folder read as /sys/fs/cgroup instead of the system's (tests set it)

    def __post_init__(self):
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise UsageError(f"{option('max_restarts', self.max_restarts)}: give a number of restarts, 0 or more")
        for key in ("stall_timeout", "startup_grace"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise UsageError(f"{option(key, value)}: give a number of seconds > 0 (a finite number)")
        if self.notify is not None and not isinstance(self.notify, str):
            raise UsageError(f"notify={self.notify!r} must be a shell command (a string)")

    def settings(self) -> WatchdogSettings:
        """What supervisor.json records of these settings (``status`` judges a stall as this watchdog would)."""
        return WatchdogSettings(self.enabled, self.stall_timeout, self.step_multiplier, self.startup_grace)


DEFAULTS = WatchdogConfig()
