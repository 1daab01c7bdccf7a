"""The way in: from what the user typed to a claimed run directory, then the supervisor (never imports torch).

``rocm-yolo train`` and ``rocm_yolo.train()`` both go through here:

1. :func:`.request.make_spec`: flags, KEY=VALUE, profile, data and resume validated into a
   :class:`~rocm_yolo.run.spec.RunSpec`, with no side effects;
2. :func:`.claim.claim`: the run directory taken and locked (one supervisor per run);
3. :func:`run`: the supervisor runs the spec; Ctrl-C and SIGTERM stop the whole tree.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from rocm_yolo.launch.claim import claim, remove_fresh_run
from rocm_yolo.launch.request import make_spec, parse_key_values
from rocm_yolo.run import ownership
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.loop import Supervisor
from rocm_yolo.supervisor.states import RunResult, State

__all__ = ["claim", "make_spec", "parse_key_values", "prepare", "run"]


def prepare(data: str | None = None, **request: Any) -> RunSpec:
    """Validate a request (:func:`make_spec`'s arguments) and claim its run directory: the first attempt's spec."""
    return claim(make_spec(data, **request))


def run(spec: RunSpec, config: WatchdogConfig, *, user_resume: bool = False) -> RunResult:
    """Run ``spec`` under the supervisor; Ctrl-C and SIGTERM stop the whole tree.

    The run directory stays locked to this process until the supervisor is done. A new run
    that ends in a usage error (the child found the data unusable) leaves no directory.
    """
    ownership.acquire(spec.run_dir)  # held already when the spec was claimed here
    try:
        supervisor = Supervisor(spec, config, user_resume=user_resume)
        previous = supervisor.install_signal_handlers() if threading.current_thread() is threading.main_thread() else {}
        try:
            for note in spec.notes:
                supervisor.log.info(note)
            result = supervisor.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        ownership.release(spec.run_dir)
    if result.state == State.USAGE_ERROR and spec.resume is None:
        remove_fresh_run(spec)
    return result
