"""``WatchdogConfig``: every watchdog setting and its default, defined once.

The CLI's flags, the Python API's arguments and the supervisor all read their defaults here,
and the values they give are checked here: a stall timeout of ``nan`` would switch the
watchdog off without a word (every comparison with it is false).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rocm_yolo.errors import UsageError
from rocm_yolo.run.profiles import DEFAULT_LADDER


@dataclass(frozen=True)
class WatchdogConfig:
    enabled: bool = True
    stall_timeout: float = 180.0  # floor, seconds
    step_multiplier: float = 10.0  # timeout is at least this many slowest recent steps
    startup_grace: float = 900.0  # before the first training batch of an attempt (scan, cache, kernel tuning)
    max_restarts: int = 3
    ladder: tuple[str, ...] = DEFAULT_LADDER
    poll_interval: float = 0.5
    term_timeout: float = 8.0
    kill_timeout: float = 4.0

    def __post_init__(self):
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise UsageError("--max-restarts must be >= 0")
        for value in (self.stall_timeout, self.startup_grace):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise UsageError("--stall-timeout and --startup-grace must be > 0 seconds (a finite number)")


DEFAULTS = WatchdogConfig()
