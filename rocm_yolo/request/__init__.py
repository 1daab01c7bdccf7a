"""The way in: from what the user typed to a claimed run directory, then the supervisor (never imports torch).

``rocm-yolo train`` and ``rocm_yolo.train()`` both go through here, with one
:class:`~.train_request.TrainRequest` (built from argparse or from keywords):

1. :func:`.validation.make_spec`: flags, KEY=VALUE, profile, data and resume validated into a
   :class:`~rocm_yolo.run.spec.RunSpec`, with no side effects;
2. :func:`.claim.claim`: the run directory taken and locked (one supervisor per run);
3. :func:`supervise`: the supervisor runs the spec; Ctrl-C and SIGTERM stop the whole tree.

- :mod:`.train_request`: ``TrainRequest``, the request as the user gave it (its options listed once);
- :mod:`.validation`: ``make_spec``, the request validated into the first attempt's spec;
- :mod:`.data_path`: DATA, the default model, and a model Ultralytics can load, checked before anything starts;
- :mod:`.ram_cache`: ``cache=ram`` shared with the workers, loaded in threads, or refused;
- :mod:`.demo`: the demo data set, written by the tool itself;
- :mod:`.resume_target`: which run and checkpoint a ``--resume`` continues;
- :mod:`.cluster`: more than one machine: the nodes of a job, from the node flags or a scheduler's variables;
- :mod:`.schedulers`: each scheduler's variables (SLURM's), a small backend of its own;
- :mod:`.claim`: the run directory taken; :mod:`.ownership`: one supervisor per run directory;
- :mod:`.ending`: how the run ended, the last line of its log and of what the terminal shows.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace

from rocm_yolo.request import ownership
from rocm_yolo.request.claim import claim, remove_fresh_run, tidy_unstarted_run
from rocm_yolo.request.ending import say_how_it_ended, trained_before
from rocm_yolo.request.train_request import TrainRequest
from rocm_yolo.request.validation import make_spec
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import RunState
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.loop import Supervisor
from rocm_yolo.supervisor.states import RunResult

__all__ = ["TrainRequest", "claim", "make_spec", "prepare", "supervise", "train"]


def prepare(request: TrainRequest) -> RunSpec:
    """Validate ``request`` and claim its run directory: the first attempt's spec."""
    return claim(make_spec(request))


def train(request: TrainRequest) -> RunResult:
    """Validate, claim and run ``request`` under its watchdog: what ``rocm-yolo train`` and ``rocm_yolo.train`` do."""
    config = request.watchdog_config()  # its errors before anything is claimed
    return supervise(prepare(request), config, user_resume=request.resuming)


def supervise(spec: RunSpec, config: WatchdogConfig, *, user_resume: bool = False) -> RunResult:
    """Run ``spec`` under the supervisor; Ctrl-C and SIGTERM stop the whole tree.

    The run directory stays locked to this process until the supervisor is done. A new run
    that ends in a usage error (the child found the data unusable) leaves no directory. On more than
    one machine each attempt may wait for the other nodes at the rendezvous, up to ``--rdzv-timeout``,
    before its first training batch: the watchdog's start-up grace covers that wait too.
    """
    if spec.nodes is not None:
        config = replace(config, startup_grace=config.startup_grace + spec.nodes.timeout)
    ownership.acquire(spec.run_dir, spec.node)  # held already when the spec was claimed here
    started = time.time()
    before = trained_before(spec)  # a resume's checkpoint, before the run changes it
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
        ownership.release(spec.run_dir, spec.node)
    if result.state == RunState.USAGE_ERROR and spec.resume is None:
        remove_fresh_run(spec)
    if spec.resume is None and not spec.created and not spec.node and result.state != RunState.FINISHED:
        tidy_unstarted_run(spec, started)  # a reused folder is the user's: what this run did not get to use goes back
    say_how_it_ended(result, before)
    return result
