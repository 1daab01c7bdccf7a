"""How a run ended, in one line: the last line of ``rocm-yolo.log`` whatever the entrance, and on the terminal.

``done: 2 epochs in 9.6 s; weights: ...`` for a finished run (a resume: the epochs it trained, ``epochs 4-6``),
``failed after 3 restart(s) (...)`` for one that gave up, and for any other end its state and exit code
(``ended: interrupted (exit 130)``), so that the log of every run says how it ended, as the terminal did.
"""

from __future__ import annotations

from rocm_yolo.process.output import RunLog, show
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import RunState
from rocm_yolo.supervisor.states import RunResult
from rocm_yolo.ultralytics_rules.checkpoint import last_epoch, summary


def trained_before(spec: RunSpec) -> int:
    """The epochs a resume starts after: its checkpoint's completed epochs (results.csv may hold rows the checkpoint
    does not, e.g. after a fall back to the verified copy; the resume trims them). Read before the run changes it."""
    if not spec.resume:
        return 0
    found = summary(spec.resume)
    if found is not None and found.epoch is not None and (found.epoch >= 0 or found.mid_epoch):
        return found.epoch + 1  # a mid-epoch checkpoint's: the epochs before the one in progress (0 in epoch 1)
    return last_epoch(spec.paths.results)  # a stripped checkpoint's -1: no count


def end_line(result: RunResult, before: int = 0) -> tuple[str, bool]:
    """(the line that says how the run ended, whether the terminal is to be told it: not what it was told already)."""
    paths = result.paths
    if result.state == RunState.FINISHED:
        epochs = last_epoch(paths.results)
        trained = f"{epochs} epoch{'s' if epochs != 1 else ''}"
        if 0 < before < epochs:  # a resume: the epochs of this run, not the run's whole count
            trained = f"epochs {before + 1}-{epochs}" if epochs > before + 1 else f"epoch {epochs}"
        retrained = sum(r.retrained_batches or 0 for r in result.recoveries)
        extra = (
            f", {result.restarts} restart(s) ({retrained:,} batches trained again), "
            f"{result.lost_seconds:.0f} s lost to hangs"
            if result.restarts
            else ""
        )
        # time stopped by Ctrl-Z or a terminal's job control: none of it
        return f"done: {trained} in {result.running_seconds:.1f} s{extra}; weights: {paths.last} and {paths.best}", True
    if result.state == RunState.FAILED:
        why = f" (exit {result.exit_code}: {result.verdict[0]})" if result.verdict else f" (exit {result.exit_code})"
        return f"failed after {result.restarts} restart(s){why}; see {paths.log}", result.detail is None
    return f"ended: {result.state.value.replace('_', ' ')} (exit {result.exit_code})", False


def say_how_it_ended(result: RunResult, before: int = 0) -> None:
    """The end line at the end of the run's log, and on stderr where the terminal has not been told; behind what a
    paused terminal has not shown yet (it is shown at exit); a terminal gone meanwhile drops it."""
    line, tell = end_line(result, before)
    if result.paths.node_dir.is_dir():  # not a run directory removed after a usage error: the log would make it again
        RunLog(result.paths.log).record(line)
    if tell:
        show(f"rocm-yolo: {line}\n")
