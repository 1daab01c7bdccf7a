"""The training child's entry: ``python -m rocm_yolo.trainer SPEC.json``.

Started fresh by the supervisor (never forked from a process that imported torch), it
orders the steps that make DataLoader workers safe:

1. ``multiprocessing.set_start_method("spawn", force=True)``, before torch is imported;
2. the environment: the profile's variables and the GPU architecture's presets;
3. torch, Ultralytics and the patches (DataLoader, Conv2d), each import checked;
4. ``YOLO(model).train(**args)`` with rocm-yolo's callbacks (heartbeat, hooks).

Whatever goes wrong becomes one line on the terminal and an exit code the supervisor acts
on (see :mod:`rocm_yolo.errors`): a user error (2), a run that already finished (3), a
broken environment (4, with ``RUN/setup-K.txt``), a rocm-yolo bug (123, with
``RUN/internal-K.txt``), or a training crash (1, with ``RUN/crash-K.txt``: restarted).

It imports nothing heavy at the top: torch comes in step 3.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

from rocm_yolo import environment, errors
from rocm_yolo.process import lifecycle
from rocm_yolo.run.spec import RunSpec

_stopping = False


def _on_sigterm(signum, frame):
    # Runs between bytecodes; during a checkpoint's save (an uninterrupted block) it waits for the save to end.
    lifecycle.stop_or_defer(lambda: _stop(signum))


def _stop(signum: int) -> None:
    # The supervisor is stopping us on purpose: what torch says about its workers dying
    # from the same signal is noise, so the terminal hears nothing more from this process.
    global _stopping
    if not _stopping:
        _stopping = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
        except OSError:
            pass
        raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)  # 1. before torch is imported
    torch_was_imported = "torch" in sys.modules

    try:
        spec = RunSpec.load(argv[0])
    except Exception as e:  # the supervisor wrote it: anything wrong with it is a rocm-yolo bug
        return errors.report_internal(e)
    from rocm_yolo.process.lifecycle import die_with_parent, dump_stacks_into
    from rocm_yolo.process.output import RunLog
    from rocm_yolo.run import devices

    paths = spec.paths
    rank = devices.rank()  # a rank of a multi-GPU run, started by torch.distributed.run
    log = RunLog(paths.log, paths.events, rank=rank)
    _guard_terminal(log, rank)  # before Ultralytics holds sys.stdout
    log.event("start_method", method=multiprocessing.get_start_method(), torch_imported=torch_was_imported)
    # no orphan if killed -9: a one-GPU child dies with the supervisor, a rank with torch's agent
    die_with_parent(_parent(rank))
    try:
        dump_stacks_into(paths, paths.trainer_stacks(os.getpid()))
    except (OSError, errors.UsageError) as e:
        return _setup_failure(spec, log, e)
    # a fatal signal (a fault in native code: the GPU runtime, a library) writes where each thread was into the
    # child's stderr, for the diagnosis and the person, then kills the process by it as before
    faulthandler.enable(all_threads=True)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if rank is None:
        return _train(spec, log)
    if spec.nodes is not None and not devices.local_rank():  # the nodes met: a node that comes later meets them anew
        _round_started(spec, log)
    from rocm_yolo.trainer.rank import reporting

    with reporting(rank) as report:
        return report(_train(spec, log))


def _guard_terminal(log, rank: int | None) -> None:
    """A terminal that goes away (EIO) is no training failure: the output goes on in the run's log (rank 0's)."""
    from rocm_yolo.process import terminal

    def lost(error: OSError) -> None:
        where = f"its output goes on in {log.log_path}" if not rank else "its output is dropped"
        log.event("terminal_lost", f"the terminal is gone ({error.strerror}): training goes on; {where}")

    terminal.guard("stdout", keep=None if rank else log.record, on_lost=lost)


def _parent(rank: int | None) -> int:
    """The process this one dies with: torch.distributed.run for a rank, else the supervisor."""
    if rank is not None:
        return int(os.environ.get(environment.TORCHRUN_PID) or os.getppid())
    return int(os.environ.get(environment.SUPERVISOR_PID, "0") or 0)


def _round_started(spec: RunSpec, log) -> None:
    from rocm_yolo.run.nodes import mark_round_started

    try:
        mark_round_started(spec.paths, spec.nodes.round)
    except OSError as e:  # the run's shared folder refuses: the next failure may then wait longer at the rendezvous
        log.info(f"cannot mark round {spec.nodes.round} started in {spec.paths.round} ({e.strerror or e})")


def _train(spec: RunSpec, log) -> int:
    from rocm_yolo.trainer import training

    try:
        return training.setup_and_train(spec, log)  # 2.-4.
    except KeyboardInterrupt:
        return errors.INTERRUPTED
    except SystemExit:
        raise
    except BaseException as e:  # before training (training handles its own errors after that)
        return _setup_failure(spec, log, e)


def _setup_failure(spec: RunSpec, log, error: BaseException) -> int:
    from rocm_yolo.setup_failure import report_setup_failure

    return report_setup_failure(spec, log, error)
