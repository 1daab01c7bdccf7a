"""The Python API: ``rocm_yolo.train(...)``, with the same validation, child process and supervisor as the CLI."""

from __future__ import annotations

from typing import Any

from rocm_yolo.errors import UsageError
from rocm_yolo.supervisor.config import DEFAULTS
from rocm_yolo.supervisor.states import RunResult


def _ladder(fallback: tuple[str, ...] | str) -> tuple[str, ...]:
    from rocm_yolo.run.profiles import parse_ladder

    if isinstance(fallback, str):
        return parse_ladder(fallback)
    if isinstance(fallback, (tuple, list)) and all(isinstance(x, str) for x in fallback):
        return parse_ladder(",".join(fallback))
    raise UsageError(f"fallback={fallback!r} must be profile names, e.g. 'fast,safe,threads,single'")


def train(
    data: str | None = None,
    *,
    workers: int | None = None,
    profile: str | None = None,
    watchdog: bool = True,
    stall_timeout: float | None = None,
    startup_grace: float | None = None,
    max_restarts: int | None = None,
    fallback: tuple[str, ...] | str = DEFAULTS.ladder,
    conv: str | None = None,
    resume: str | bool | None = None,
    checkpoint_every: str | int | None = None,
    **kwargs: Any,
) -> RunResult:
    """Train like ``rocm-yolo train``: the same validation, child process and supervisor.

    ``kwargs`` are the other flags (model, epochs, imgsz, batch, device, project, name) and any
    Ultralytics train argument. ``checkpoint_every`` takes what ``--checkpoint-every`` takes
    ("10m", "30s", "1h", "500ba", or 0 for off; default "10m", on resume the run's own). The
    watchdog's settings default to :class:`~rocm_yolo.supervisor.config.WatchdogConfig`'s.
    Raises :class:`UsageError` for bad input; returns a :class:`RunResult` whose ``exit_code``
    matches the CLI's.
    """
    from rocm_yolo import launch
    from rocm_yolo.launch.request import FLAG_KEYS
    from rocm_yolo.supervisor.config import WatchdogConfig

    ladder = _ladder(fallback)
    watchdog_args = {"stall_timeout": stall_timeout, "startup_grace": startup_grace, "max_restarts": max_restarts}
    config = WatchdogConfig(
        enabled=watchdog, ladder=ladder, **{k: v for k, v in watchdog_args.items() if v is not None}
    )
    flags = {k: kwargs.pop(k, None) for k in FLAG_KEYS if k not in ("workers",)}
    spec = launch.prepare(
        data,
        workers=workers,
        profile=profile,
        resume=resume,
        conv=conv,
        checkpoint_every=checkpoint_every,
        extra=kwargs,
        **flags,
    )
    return launch.run(spec, config, user_resume=bool(resume))
