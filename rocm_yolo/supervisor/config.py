"""``WatchdogConfig``: every watchdog setting and its default, defined once.

The CLI's flags, the Python API's arguments and the supervisor all read their defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass

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


DEFAULTS = WatchdogConfig()
