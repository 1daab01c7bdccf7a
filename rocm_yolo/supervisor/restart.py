"""What the next attempt starts from after a hang or a crash, tidying a run that finished, what stopped one.

- After every attempt, once its tree is gone, the temporary files of the checkpoint writes the end of the tree cut
  short (a stop that outlasted the grace, a SIGKILL) are removed, each said in one line
  (:func:`remove_cut_writes`): only this node's, and only those whose writer is gone.
- A finished run says what of its end did not happen: a crash or a kill during the end of training leaves
  ``last.pt`` or ``best.pt`` unstripped, the final validation not run (:func:`tidy_finished`); a run stopped by a
  signal says how it goes on, or that it is done (:func:`after_stop`).
- On more than one machine the next attempt joins the next round of the rendezvous (:func:`next_spec`); the other
  nodes themselves are :mod:`.peers`'.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from shlex import quote

from rocm_yolo.diagnosis.classes import LADDER, P2P_OFF
from rocm_yolo.diagnosis.remedies import Decision
from rocm_yolo.environment import untrusted
from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import next_profile, resolve
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import weights
from rocm_yolo.run.atomic import copy_atomic, temporaries
from rocm_yolo.run.events import FROM_PYTHON, read_events
from rocm_yolo.run.nodes import join_round
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Failure
from rocm_yolo.ultralytics_rules.checkpoint import summary


def next_spec(spec: RunSpec, ladder: tuple[str, ...], log: RunLog | None = None) -> RunSpec:
    """The spec of the attempt after ``spec``: the next profile of ``ladder``, from the newest valid checkpoint.

    What the user set carries over as :func:`~rocm_yolo.run.spec.carry_over` says (the rule a
    ``--resume`` follows too): the workers start again from the user's request (a profile's cut is
    not cut again), and a loader setting the next profile cannot take is dropped, with a note.
    On more than one machine the next attempt joins the next round of the rendezvous, and its
    profile is that round's, the same on every node (:func:`~rocm_yolo.run.nodes.join_round`).
    """
    profile = next_profile(spec.profile, ladder)
    resume = None
    try:
        path, note = weights.choose_resume_point(spec.paths.last)
        resume = str(path)
        if note and log is not None:
            log.info(note)
    except UsageError:
        resume = None  # nothing saved yet: start again in the same directory
    train_args = {**spec.train_args, "exist_ok": True}
    spec = spec.with_changes(resume=resume, attempt=spec.attempt + 1, train_args=train_args)
    if spec.nodes is not None:
        try:
            found = join_round(spec.paths, profile, after=spec.nodes.round)
            number, profile = found.number, found.profile
        except OSError as e:  # the shared storage refuses: the round every node would open next, on this profile
            number = spec.nodes.round + 1
            if log is not None:
                log.info(f"cannot read or move the round in {spec.paths.round} ({e.strerror or e}): round {number}")
        spec = spec.with_changes(nodes=replace(spec.nodes, round=number))
    return spec.with_profile(profile, resolve, say=log.info if log is not None else None)


def tidy_finished(spec: RunSpec, log: RunLog, *, cut_short: bool = False) -> str | None:
    """A finished run keeps ``last.pt`` and ``best.pt`` (stripped by the end of training), and nothing else in
    ``weights/``: the verified copy is for a run that can still be resumed, and its mid-epoch checkpoints only take
    disk space (``--resume RUN --epochs N`` trains it on from ``last.pt``). If ``last.pt`` was moved aside as
    damaged, the verified copy becomes ``last.pt`` again; while ``last.pt`` does not verify, the copy stays.

    Then it says what of the end of training did not happen: a file it did not strip, and with ``cut_short`` (the
    training process failed after its last epoch) the final validation, with how to run it. Returns what ``status``
    says of that end (the run's detail), or None.
    """
    paths = spec.paths
    last, good = paths.last, paths.last_good
    try:
        if not last.exists() and weights.verify(good) is None:
            copy_atomic(good, last, durable=True)
        if weights.verify(last) is None:  # mid-epoch checkpoints of a finished run: nothing to continue
            weights.remove_mid_checkpoints(paths)
            good.unlink(missing_ok=True)
    except OSError as e:  # housekeeping only: the weights are there either way
        log.info(f"could not tidy {paths.weights}: {e.strerror or e}")
    return _end_not_done(spec, log, cut_short)


def _end_not_done(spec: RunSpec, log: RunLog, cut_short: bool) -> str | None:
    """Say what of the end of training did not happen, as the weights show it (the end strips them, then validates)."""
    paths = spec.paths
    kept = [p.name for p in (paths.last, paths.best) if p.exists() and not getattr(summary(p), "stripped", True)]
    held = (
        f"{' and '.join(kept)} still {'hold' if len(kept) > 1 else 'holds'} the optimizer (the end of training "
        f"strips it; the weights load and predict as they are)"
    )
    if not cut_short:
        if kept:
            log.event("end_not_done", f"the end of training was cut short: {held}", unstripped=kept)
        return None
    validation = "did not run" if kept else "did not finish"
    what = f"{held}, and the final validation {validation}" if kept else f"the final validation {validation}"
    best = paths.best if paths.best.exists() else paths.last
    log.event(
        "end_not_done",
        f"the training process failed after the last epoch, in the end of training: {what}; validate with yolo val "
        f"{quote(f'model={best}')} {quote(f'data={spec.data}')}",
        unstripped=kept,
    )
    return f"the final validation {validation}"


def trained_all(spec: RunSpec, path: str | Path) -> bool:
    """Whether the checkpoint ``path`` belongs to a run that trained all the epochs of ``spec`` (all of a resume's
    ``--epochs N``), read without torch."""
    found = summary(path)
    return found is not None and found.finished_for(spec.extended_epochs)


def after_stop(spec: RunSpec, log: RunLog) -> str | None:
    """A stop signal ended the run: say how it goes on. If it came during the final validation or the final save,
    every epoch is trained and the weights are final (the final save is atomic): the run is done, and this returns
    what ``status`` says of it (only the final validation did not finish); else None."""
    paths = spec.paths
    if paths.last.exists() and trained_all(spec, paths.last):
        tidy_finished(spec, log)
        best = paths.best if paths.best.exists() else paths.last
        log.info(
            f"every epoch was trained and the weights are final ({paths.last}, {paths.best}); the final validation "
            f"was interrupted: validate with yolo val {quote(f'model={best}')} {quote(f'data={spec.data}')}"
        )
        return "the final validation was interrupted"
    if paths.last.exists() or paths.mid_checkpoints():
        log.info(f"resume with: {resume_command(spec)}")
    return None


def resume_command(spec: RunSpec) -> str:
    """How the user continues the run of ``spec``, in the language they started it in: ``rocm_yolo.train(resume=...)``
    from Python (:data:`~rocm_yolo.run.events.FROM_PYTHON`), else the command line; on more than one machine, on every
    node, with its node options."""
    if FROM_PYTHON.get():
        command, options = f"rocm_yolo.train(resume={str(spec.paths.last)!r})", "nnodes=, node_rank=, rdzv_endpoint="
    else:
        command, options = f"rocm-yolo train --resume {quote(str(spec.paths.last))}", "node flags"
    if spec.nodes is None:
        return command
    if spec.nodes.source == "flags":
        return f"{command} and the same {options}, on every node"
    return f"{command} on every node (srun)"


def restart_line(
    spec: RunSpec, action: str, decision: Decision | None, failure: Failure | None, most: int, left: int
) -> str:
    """``restart 1/3 with profile 'safe' from RUN/weights/last.pt (2 left)``: the attempt of ``spec`` after a
    ``failure``, on the profile the remedy (``action``, of ``decision``) chose, and where it starts (``most``: the
    restarts allowed, ``left`` of them after this one)."""
    how = f"with profile '{spec.profile}'"
    if action != LADDER and failure is not None:
        how = f"on the same profile '{spec.profile}' ({failure.cls}: the loader is not the cause)"
    if action == P2P_OFF:
        how = f"on the same profile '{spec.profile}' {decision.reason}"
    elif action == LADDER and decision is not None and decision.reason:
        how += f" ({decision.reason})"  # host memory: what takes it
    return (
        f"restart {most - left}/{most} {how}"
        + (f" from {spec.resume}" if spec.resume else " from the start (no checkpoint yet)")
        + f" ({left} left)"
    )


def say_what_is_kept(spec: RunSpec, log: RunLog) -> None:
    """After an environment error: which checkpoint a later resume will start from."""
    kept = last_loadable(spec)
    if kept is not None:
        log.info(f"the last loadable checkpoint is {kept}: once that is fixed, continue with {resume_command(spec)}")


def last_loadable(spec: RunSpec):
    """The checkpoint a later resume will start from (the newest valid one, mid-epoch or not), or None."""
    try:
        return weights.plan_resume_point(spec.paths.last).path
    except UsageError:
        return None


def environment_error(spec: RunSpec) -> str | None:
    """What the newest environment error of the run was (its ``setup_error`` event), for ``status``."""
    found = [e for e in read_events(spec.paths.events) if e.get("event") == "setup_error" and e.get("error")]
    return f"environment error: {found[-1]['error']}" if found else None


# --------------------------------------------------------------------------- writes cut short


def remove_leftovers(spec: RunSpec) -> list[Path]:
    """Once an attempt's tree is gone: what its processes left that no one reads any more, removed; the paths.

    - the stack files of its dead processes (``stacks/trainer-PID.txt``, ``worker-PID.txt``: faulthandler's, empty
      unless a hang was dumped, and then copied into ``hang-K-stacks.txt`` before the kill), and ``stacks/`` itself
      when that empties it: it would gain a file for every process of every attempt;
    - multiprocessing's temporary folder (``/tmp/pymp-*``, the fork server's socket) of a trainer or rank that was
      killed before its own clean-up ran, as its ``mp_tempdir`` event names it (in the run's private folder): only
      a ``pymp-`` folder of the user's own, not a link.
    """
    removed = []
    stacks = spec.paths.stacks
    for path in sorted(stacks.glob("*-*.txt")) if stacks.is_dir() else []:
        pid = path.stem.rpartition("-")[2]
        if path.stem.startswith(("trainer-", "worker-")) and pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    try:
        stacks.rmdir()  # if empty
    except OSError:
        pass
    for record in read_events(spec.paths.events):
        path = Path(str(record.get("path", ""))) if record.get("event") == "mp_tempdir" else None
        if path is None or alive(record.get("pid")) or not path.name.startswith("pymp-") or not path.is_dir():
            continue
        if untrusted(path) is None:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_cut_writes(spec: RunSpec, log: RunLog) -> list[str]:
    """Once an attempt's tree is gone: the temporary files of the checkpoint writes its end cut short (a stop that
    outlasted the grace, a SIGKILL), removed, each said in one line; the files they were to become.

    Only this node's (on more than one machine their names carry the node: another node's rank may write into the
    same ``weights/`` now), and only those whose writer is gone (a process stuck past its SIGKILL keeps its own).
    """
    cut = []
    for found in temporaries(spec.paths.weights):
        if found.node != spec.node or alive(found.pid):
            continue
        try:
            found.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            log.info(f"cannot remove {found.path}, of a checkpoint write cut short: {e.strerror or e}")
            continue
        target = spec.paths.weights / found.target
        before = ""
        if target.exists():
            before = f"; the {found.target} before it is kept"
        elif spec.paths.last.exists() or spec.paths.mid_checkpoints():
            before = "; the checkpoints before it are kept"
        log.event(
            "write_cut_short",
            f"the write of {target} was cut short as the training process ended: its temporary file is removed{before}",
            path=str(found.path),
            target=found.target,
        )
        cut.append(found.target)
    return cut
