"""The Python API: ``rocm_yolo.train(...)``, the same request, validation, child process and supervisor as the CLI."""

from __future__ import annotations

from typing import Any

from rocm_yolo.supervisor.states import RunResult


def train(data: str | None = None, **kwargs: Any) -> RunResult:
    """Train like ``rocm-yolo train``: the same request, validation, child process and supervisor.

    ``data``: a dataset YAML (a directory of class folders for a classification model), a dataset
    Ultralytics ships by name (``coco8.yaml``), or ``"demo"``. The keywords are the fields of
    :class:`~rocm_yolo.request.train_request.TrainRequest`, the options of ``rocm-yolo train``:

    - the training: ``model`` (a .pt checkpoint or a .yaml model; default Ultralytics' ``yolo26n.pt``),
      ``epochs``, ``imgsz``, ``batch``, ``device`` (``"cpu"``, ``"0"``, ``"0,1"`` for several GPUs),
      ``project``, ``name``, ``resume`` (a run's ``last.pt`` or directory, or True: the newest run);
    - the loaders: ``workers``, ``profile`` (``fast``, ``safe``, ``threads``, ``single``), and the loader
      settings ``persistent_workers``, ``prefetch_factor``, ``pin_memory``, ``timeout``,
      ``val_workers``, ``start_method``, ``threads``;
    - rocm-yolo's own: ``conv`` (the Conv2d strategy), ``checkpoint_every`` (``"10m"``, ``"500ba"``, 0);
    - the watchdog: ``watchdog`` (False: no stall detection, no restarts), ``stall_timeout``,
      ``startup_grace``, ``max_restarts``, ``fallback`` (profile names), ``notify`` (a shell command);
      their defaults are :class:`~rocm_yolo.supervisor.config.WatchdogConfig`'s;
    - more than one machine: ``nnodes``, ``node_rank``, ``rdzv_endpoint``, ``rdzv_timeout``;

    and any other Ultralytics train argument (``lr0=0.01``, ``cache="ram"``).

    Returns a :class:`RunResult` once the run ends; its ``exit_code`` is the CLI's (0 done; 1 failed
    after the allowed restarts; 2 the training process itself refused the input; 4 an environment error
    once the run had started, a GPU fault that came back, GPU out of memory; 5 the same failure twice;
    123 a rocm-yolo bug), with ``last``, ``best``, ``restarts`` and ``recoveries``.

    Raises, before anything starts (nothing written, no process started):

    - :class:`rocm_yolo.UsageError` (a ``ValueError``): bad input, in one line that names the keyword
      (``model='notes.txt': ...``) and the fix;
    - :class:`rocm_yolo.SetupError` (a ``RuntimeError``): the environment refuses the run, e.g. a project
      directory that cannot be created or written;

    and :class:`KeyboardInterrupt` on Ctrl-C (a kernel's interrupt): the whole training tree is stopped
    first; its ``result`` attribute is the :class:`RunResult` (exit code 130), and the rest of a script, or
    a notebook's next cells, do not run on.

    What rocm-yolo shows goes where ``sys.stderr`` goes (in Jupyter: the cell), and its advice is in Python
    (``resume with: rocm_yolo.train(resume=...)``).
    """
    from rocm_yolo import errors, request

    token = errors.FROM_PYTHON.set(True)
    try:
        result = request.train(request.TrainRequest.from_kwargs(data, **kwargs))
    finally:
        errors.FROM_PYTHON.reset(token)
    if result.exit_code == errors.INTERRUPTED:  # Ctrl-C: the tree is gone; stop the caller as Python does
        stop = KeyboardInterrupt()
        stop.result = result
        raise stop
    return result
