"""What the next attempt starts from after a hang or a crash, tidying a run that finished, what stopped one."""

from __future__ import annotations

from dataclasses import replace

from rocm_yolo.errors import UsageError
from rocm_yolo.run import checkpoints
from rocm_yolo.run.atomic import copy_atomic
from rocm_yolo.run.devices import join_round
from rocm_yolo.run.events import RunLog, read_events
from rocm_yolo.run.profiles import next_profile, resolve
from rocm_yolo.run.spec import RunSpec, carry_over


def next_spec(spec: RunSpec, ladder: tuple[str, ...], log: RunLog | None = None) -> RunSpec:
    """The spec of the attempt after ``spec``: the next profile of ``ladder``, from the newest valid checkpoint.

    What the user set carries over as :func:`~rocm_yolo.run.spec.carry_over` says (the rule a
    ``--resume`` follows too): the workers start again from the user's request (a profile's cut is
    not cut again), and a loader setting the next profile cannot take is dropped, with a note.
    On more than one machine the next attempt joins the next round of the rendezvous, and its
    profile is that round's, the same on every node (:func:`~rocm_yolo.run.devices.join_round`).
    """
    profile = next_profile(spec.profile, ladder)
    resume = None
    try:
        path, note = checkpoints.choose_resume_point(spec.paths.last)
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
    return with_profile(spec, profile, log)


def with_profile(spec: RunSpec, profile: str, log: RunLog | None = None) -> RunSpec:
    """``spec`` on ``profile``, what the user set carried over (:func:`~rocm_yolo.run.spec.carry_over`); the same
    spec when it is on ``profile`` already (the last rung repeats: the user's overrides included)."""
    if profile == spec.profile:
        return spec
    carried = carry_over(spec, profile)
    if carried.dropped and log is not None:
        log.info(carried.note(profile))
    resolved = resolve(profile, carried.workers, carried.loader, val=carried.val)
    return spec.with_changes(
        profile=profile,
        loader=resolved.loader,
        val=resolved.val,
        env=resolved.env,
        user_keys=carried.user_keys,
    )


def tidy_finished(spec: RunSpec, log: RunLog) -> None:
    """A finished run keeps ``last.pt`` and ``best.pt`` (stripped by the end of training) and the verified copy of its
    last epoch's save, with the optimizer, from which ``--resume RUN --epochs N`` trains it on; its mid-epoch
    checkpoints only take disk space. If ``last.pt`` was moved aside as damaged, the verified copy becomes
    ``last.pt`` again.
    """
    paths = spec.paths
    last, good = paths.last, paths.last_good
    try:
        if not last.exists() and checkpoints.verify(good) is None:
            copy_atomic(good, last, durable=True)
        if checkpoints.verify(last) is None:  # mid-epoch checkpoints of a finished run: nothing to continue
            checkpoints.remove_mid_checkpoints(paths)
    except OSError as e:  # housekeeping only: the weights are there either way
        log.info(f"could not tidy {paths.weights}: {e.strerror or e}")


def resume_command(spec: RunSpec) -> str:
    """How the user continues the run of ``spec`` (on more than one machine: every node, with its node flags)."""
    command = f"rocm-yolo train --resume {spec.paths.last}"
    if spec.nodes is None:
        return command
    if spec.nodes.source == "flags":
        return f"{command} and the same node flags, on every node"
    return f"{command} on every node (srun)"


def last_loadable(spec: RunSpec):
    """The checkpoint a later resume will start from (the newest valid one, mid-epoch or not), or None."""
    try:
        return checkpoints.plan_resume_point(spec.paths.last).path
    except UsageError:
        return None


def environment_error(spec: RunSpec) -> str | None:
    """What the newest environment error of the run was (its ``setup_error`` event), for ``status``."""
    found = [e for e in read_events(spec.paths.events) if e.get("event") == "setup_error" and e.get("error")]
    return f"environment error: {found[-1]['error']}" if found else None
