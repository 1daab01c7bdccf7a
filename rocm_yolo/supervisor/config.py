"""``WatchdogConfig``: every watchdog setting and its default, defined once.

The supervisor reads its settings here, and so do the options that give them: each setting a user gives (``rocm-yolo
train``'s watchdog options, ``rocm_yolo.train``'s keywords) is declared once, with its help and the least a user may
give (:meth:`WatchdogConfig.help`, :meth:`WatchdogConfig.minimum`), and
:class:`~rocm_yolo.request.train_request.TrainRequest` takes them from here. The values given are checked here: a
stall timeout of ``nan`` would switch the watchdog off without a word (every comparison with it is false).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from rocm_yolo import environment
from rocm_yolo.errors import UsageError, option
from rocm_yolo.gpu.release import DEFAULT_TIMEOUT as RELEASE_TIMEOUT
from rocm_yolo.policy.profiles import DEFAULT_LADDER
from rocm_yolo.run.supervisor_state import WatchdogSettings


def _setting(help: str, *, minimum: float | None = None) -> dict:
    """A setting a user gives: its help (``{default}`` and ``{minimum}`` are filled in from the declaration), and the
    least a user may give (an epoch's end, a save or a validation's start pass seconds without a heartbeat)."""
    return {"help": help, "minimum": minimum}


@dataclass(frozen=True)
class WatchdogConfig:
    enabled: bool = True
    stall_timeout: float = field(  # floor, seconds
        default=180.0,
        metadata=_setting(
            "a hang is no progress for this long at least (default: {default:g}, at least {minimum:g}; grows with "
            "slow steps)",
            minimum=10.0,  # with 1 s the final validation was called a hang
        ),
    )
    step_multiplier: float = 10.0  # timeout is at least this many slowest recent steps
    startup_grace: float = field(  # before the first training batch of an attempt (scan, cache, kernel tuning)
        default=900.0,
        metadata=_setting(
            "allowance before the first training batch of each attempt (default: {default:g}, at least {minimum:g})",
            minimum=10.0,
        ),
    )
    restart_startup_factor: float = 3.0  # a restart's allowance: this many times the run's own first start-up
    max_restarts: int = field(default=3, metadata=_setting("restarts after a hang or crash (default: {default})"))
    ladder: tuple[str, ...] = field(
        default=DEFAULT_LADDER,
        metadata=_setting(
            "profiles to step through on each restart after a loader hang or a dead worker (other causes have their "
            "own remedy) (default: {default})"
        ),
    )
    poll_interval: float = 0.5
    term_timeout: float = 8.0
    kill_timeout: float = 4.0
    gpu_release_timeout: float = RELEASE_TIMEOUT  # after a GPU fault or hang: wait this long at most for the GPU
    notify: str | None = field(  # a shell command run for each event of the run, the event as JSON on its stdin
        default=None,
        metadata=_setting(
            "run CMD through the shell at each event of the run (started, hang, crash, restart, finished, failed, "
            f"stopped), one JSON object on its stdin (default: ${environment.NOTIFY}); bounded, never delays training"
        ),
    )
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

    @classmethod
    def help(cls, name: str) -> str:
        """The help of setting ``name``, its default and minimum filled in from its declaration."""
        declared = _declared(name)
        default = ",".join(declared.default) if isinstance(declared.default, tuple) else declared.default
        return declared.metadata["help"].format(default=default, minimum=declared.metadata["minimum"])

    @classmethod
    def minimum(cls, name: str) -> float | None:
        """The least a user may give setting ``name`` (None: any value the setting takes)."""
        return _declared(name).metadata.get("minimum")


def _declared(name: str):
    return next(f for f in fields(WatchdogConfig) if f.name == name)


DEFAULTS = WatchdogConfig()
