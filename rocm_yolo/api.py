"""The Python API: ``rocm_yolo.train(...)``, the same request, validation, child process and supervisor as the CLI."""

from __future__ import annotations

from typing import Any

from rocm_yolo.supervisor.states import RunResult


def train(data: str | None = None, **kwargs: Any) -> RunResult:
    """Train like ``rocm-yolo train``: the same request, validation, child process and supervisor.

    The keywords are the options of ``rocm-yolo train`` (the fields of
    :class:`~rocm_yolo.launch.train_request.TrainRequest`: ``model``, ``workers``, ``profile``,
    ``epochs``, ``imgsz``, ``batch``, ``device``, ``project``, ``name``, ``resume``, ``conv``,
    ``checkpoint_every``, ``watchdog``, ``stall_timeout``, ``startup_grace``, ``max_restarts``,
    ``fallback``, ``notify``), and any Ultralytics train argument or loader setting (``lr0=0.01``,
    ``timeout=60``). The watchdog's settings default to
    :class:`~rocm_yolo.supervisor.config.WatchdogConfig`'s. Raises :class:`UsageError` for bad
    input; returns a :class:`RunResult` whose ``exit_code`` matches the CLI's.

    What rocm-yolo shows goes where ``sys.stderr`` goes (in Jupyter: the cell), and its advice is in Python
    (``resume with: rocm_yolo.train(resume=...)``). Ctrl-C (a kernel's interrupt) stops the whole training tree,
    then raises :class:`KeyboardInterrupt` (its ``result`` attribute: the :class:`RunResult`, exit code 130), so
    that the rest of a script, or a notebook's next cells, do not run on.
    """
    from rocm_yolo import errors, launch
    from rocm_yolo.run.events import FROM_PYTHON

    token = FROM_PYTHON.set(True)
    try:
        result = launch.train(launch.TrainRequest.from_kwargs(data, **kwargs))
    finally:
        FROM_PYTHON.reset(token)
    if result.exit_code == errors.INTERRUPTED:  # Ctrl-C: the tree is gone; stop the caller as Python does
        stop = KeyboardInterrupt()
        stop.result = result
        raise stop
    return result
