"""Taking the run directory for a spec: after validation, before the supervisor starts.

A new run claims ``project/name`` (or the next free name: ``train``, ``train-2``, ...) and
holds its lock; ``exist_ok=True`` reuses an existing directory unless it holds a checkpoint
of another run or another supervisor holds it (and drops the old run's tracker record). A
resume first refuses a run that has finished (writing nothing), then holds its run's lock
and takes the checkpoint it starts from (which may move a damaged ``last.pt`` aside).

On more than one machine every node claims the same directory, ``project/name`` as given (never
``name-2``: the nodes share it), holds its node's lock, and joins the round of the rendezvous the
other nodes agree on (:func:`rocm_yolo.run.nodes.join_round`), with its loader profile.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from rocm_yolo.errors import UsageError, command, option
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.request import ownership
from rocm_yolo.request.resume_target import resume_point
from rocm_yolo.run.nodes import join_round
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec, next_attempt
from rocm_yolo.ultralytics_rules.checkpoint import summary


def claim(spec: RunSpec) -> RunSpec:
    """The spec with its run directory claimed and held by this process (and, for a resume, its checkpoint).

    A new directory is recorded as this run's own (``spec.created``): clean-up touches only such a one.
    """
    if spec.resume is not None:
        return _join(_claim_resume(spec))
    if spec.nodes is not None:
        run_dir, created = _claim_node(Path(spec.run_dir), spec.node)
    else:
        run_dir, created = _claim_new(Path(spec.run_dir), bool(spec.train_args.get("exist_ok", False)))
    reused = not created and not spec.node  # one machine, or node 0 of several: the folder is in its care
    if reused:  # a reused folder's results.csv: Ultralytics unlinks it; kept aside until an epoch is trained
        keep_results_aside(RunPaths(run_dir))
    train_args = {**spec.train_args, "project": str(run_dir.parent), "name": run_dir.name, "exist_ok": True}
    attempt = next_attempt(run_dir, spec.node)  # a reused directory keeps the reports already in it
    if reused:  # a new run opens new tracker runs: only its own attempts continue them
        RunPaths(run_dir).tracker.unlink(missing_ok=True)
    return _join(spec.with_changes(run_dir=str(run_dir), train_args=train_args, created=created, attempt=attempt))


def _join(spec: RunSpec) -> RunSpec:
    """On more than one machine: the round of the rendezvous this node's first attempt joins, and its profile."""
    if spec.nodes is None:
        return spec
    found = join_round(spec.paths, spec.profile, own_port=spec.nodes.own_port)
    nodes = replace(spec.nodes, round=found.number)
    if spec.nodes.own_port and found.port:  # no port given: the run's own, the same on every node
        nodes = nodes.at_port(found.port)
    notes = spec.notes
    if found.profile != spec.profile:
        notes += (
            f"node {spec.node} joins round {found.number} of the rendezvous on its profile '{found.profile}' (not "
            f"'{spec.profile}'): every node trains on the same one",
        )
    joined = spec.with_profile(found.profile, resolve).with_changes(nodes=nodes)
    return joined.with_changes(notes=notes)


def _claim_node(wanted: Path, node: int) -> tuple[Path, bool]:
    """A node's share of a new multi-node run: ``wanted`` itself (every node trains into it), unless it holds a
    checkpoint (a run the nodes must resume) or another supervisor holds this node of it."""
    try:
        wanted.mkdir(parents=True)
        created = True
    except FileExistsError:
        created = False
    except OSError as e:
        raise ownership._setup_error("create the run directory", wanted, e) from None
    ownership.acquire(wanted, node)  # refuses a second supervisor of this node before anything is touched
    found = RunPaths(wanted).checkpoints()
    if found:
        ownership.release(wanted, node)
        raise UsageError(_holds_a_run(wanted, found[0]))
    return wanted, created


def _claim_new(wanted: Path, exist_ok: bool) -> tuple[Path, bool]:
    """(the directory, whether this run created it). Ultralytics' naming: ``train``, ``train-2``, ...

    With ``exist_ok=True`` an existing directory is reused, unless it holds a checkpoint of
    another run (only a resume continues that one) or another supervisor holds it.
    """
    if exist_ok and wanted.is_dir():
        ownership.acquire(wanted)  # refuses a live run before anything is touched
        found = RunPaths(wanted).checkpoints()
        if found:
            ownership.release(wanted)
            raise UsageError(_holds_a_run(wanted, found[0]))
        return wanted, False
    path = ownership.claim_run_dir(wanted.parent, wanted.name)
    ownership.acquire(path)
    return path, True


def _holds_a_run(run_dir: Path, found: Path) -> str:
    """Why ``exist_ok=True`` may not reuse ``run_dir``: it holds a run's checkpoint; and what works instead."""
    finished = summary(found)
    last = RunPaths(run_dir).last
    if finished is not None and finished.finished:
        return (
            f"{run_dir} holds a run that finished all {finished.epochs} epochs ({found.relative_to(run_dir)}): train "
            f"it further with {command(resume=run_dir, epochs='N')}, or start a new run from its weights with "
            f"{option('model', last)} and another {option('name')}"
        )
    return (
        f"{run_dir} holds the checkpoint {found.relative_to(run_dir)} of a run that has not finished: continue it "
        f"with {option('resume', run_dir)}, or choose another {option('name')}"
    )


def _claim_resume(spec: RunSpec) -> RunSpec:
    epochs = spec.train_args.get("epochs") if "epochs" in spec.user_keys else None  # --resume RUN --epochs N
    resume_point(Path(spec.resume), epochs)  # a finished run, or nothing to resume: refused before anything is written
    ownership.acquire(spec.run_dir, spec.node)  # refuses a live run before anything in it is touched
    try:
        ckpt, note = resume_point(Path(spec.resume), epochs).take()
    except BaseException:
        ownership.release(spec.run_dir, spec.node)
        raise
    return spec.with_changes(resume=str(ckpt), model=str(ckpt), notes=spec.notes + ((note,) if note else ()))


def keep_results_aside(paths: RunPaths) -> None:
    if paths.results.is_file() and not paths.results_before.exists():
        os.replace(paths.results, paths.results_before)


def tidy_unstarted_run(spec: RunSpec, started: float) -> None:
    """A new run in a reused folder that trained no epoch (a usage or setup error, a stop, a crash before the first
    epoch ended): the folder's results.csv back, and no stack file of this run's processes left in it."""
    paths = spec.paths
    if paths.results.exists():  # an epoch was trained: the folder is the run's now
        return
    if paths.results_before.exists():
        os.replace(paths.results_before, paths.results)
    for stack in list(paths.stacks.glob("*.txt")) if paths.stacks.is_dir() else []:
        try:
            if stack.stat().st_mtime >= started:  # this run's trainer, fork server or workers
                stack.unlink()
        except OSError:
            continue
    try:
        paths.stacks.rmdir()  # if empty
    except OSError:
        pass


def remove_fresh_run(spec: RunSpec) -> None:
    """After a usage error before training: remove the run directory if this run created it and it holds no weights."""
    run_dir = Path(spec.run_dir)
    holders = [ownership.holder(run_dir, k) for k in [None, *RunPaths(run_dir, None).nodes()]]
    held = any(pid is not None for pid in holders)
    if not spec.created or any(RunPaths(run_dir).weights.glob("*.pt")) or held:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
