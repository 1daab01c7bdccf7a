"""``rocm-yolo status [RUN_DIR]``: how a run is doing, readable from another terminal.

On more than one machine it shows every node (``RUN/rocm_yolo/node-K/``, on the storage they share):
its supervisor's state, where its first rank is and each of its other ranks, as the nodes' own
files say; and the round of the rendezvous they agree on. A node whose supervisor runs on another
machine cannot be asked whether it lives: its heartbeat's age says it.

A run that is not running and not finished (stopped, failed, ...) also shows what a resume will start from: the
checkpoint ``rocm-yolo train --resume RUN`` takes (:func:`rocm_yolo.request.resume_target.resume_point`: the newest
valid one, mid-epoch or ``last.pt``), read without torch. The heartbeat says where the run was last heard, which
may be batches or epochs past it.

A running trainer that is stopped (state T: SIGSTOP, or a debugger's stop), read from ``/proc`` as ``ps`` would,
or whose start-up has not moved (CPU time, I/O) for a while, as its supervisor recorded it, is said with how long.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from rocm_yolo import errors
from rocm_yolo.errors import UsageError
from rocm_yolo.policy.placement import fits
from rocm_yolo.process import kernel_view
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.request.resume_target import resume_point
from rocm_yolo.run import heartbeat
from rocm_yolo.run.devices import Relayout
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.nodes import read_round
from rocm_yolo.run.paths import STATE_DIRNAME, RunPaths
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import RunState, SupervisorState, read_state
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.supervisor.stall import StallDetector
from rocm_yolo.ultralytics_rules.checkpoint import summary

LIVE = (RunState.RUNNING.value, "stalled?")  # states of a run that trains now
TOLD = ("profile", "restarts", "lost_seconds", "detail", "verdict")  # of the supervisor's record, as it holds them
HEARD = ("phase", "epoch", "epochs", "batch", "batches", "it_s", "attempt")  # of a heartbeat: where the run is
RANK_HEARD = ("phase", "epoch", "batch", "batches", "attempt")  # of a rank's: where that rank is


def newest_run(root: Path = Path("runs")) -> Path | None:
    name = RunPaths(".", None).heartbeat.name
    beats = [p for p in root.glob(f"**/{STATE_DIRNAME}/{name}") if p.is_file()]
    beats += [p for p in root.glob(f"**/{STATE_DIRNAME}/node-*/{name}") if p.is_file()]
    newest = max(beats, key=lambda p: p.stat().st_mtime, default=None)
    if newest is None:
        return None
    return newest.parent.parent.parent if newest.parent.name.startswith("node-") else newest.parent.parent


def _multi_node(run_dir: Path) -> list[int]:
    """The nodes of a multi-node run, when its newest state is theirs (not a later resume on one machine)."""
    paths = RunPaths(run_dir, None)
    nodes = paths.nodes()

    def updated(p: RunPaths) -> float:
        try:
            return p.supervisor.stat().st_mtime
        except OSError:
            return 0.0

    if not nodes or updated(paths) > max(updated(paths.for_node(k)) for k in nodes):
        return []
    return nodes


def _stalled(hb: Heartbeat, sup: SupervisorState | None, now: float) -> bool:
    """What the run's own watchdog would say of a heartbeat this old (its settings as the supervisor recorded them)."""
    saved = sup.watchdog if sup is not None else None
    fields = {k: getattr(saved, k) for k in ("stall_timeout", "step_multiplier", "startup_grace")} if saved else {}
    detector = StallDetector(WatchdogConfig(**fields), now=hb.time)
    detector.observe(hb, now=hb.time)
    return detector.stalled(now)


def collect(run_dir: Path, now: float | None = None) -> dict:
    """What ``status`` says of a run: its state and progress (node 0's on several machines), and each node's."""
    now = time.time() if now is None else now
    nodes = _multi_node(run_dir)
    info = _collect(RunPaths(run_dir, nodes[0] if nodes else None), now)
    if info["state"] not in (*LIVE, RunState.FINISHED.value) and info.get("phase") != "done":
        info["resume"] = resume_from(RunPaths(run_dir))  # the run's weights, whichever node wrote them
    if not nodes:
        return info
    info["nodes"] = [{"node": k, **_collect(RunPaths(run_dir, k), now)} for k in nodes]
    found = read_round(RunPaths(run_dir, None))
    if found is not None:
        info["round"] = asdict(found)
    spec = _spec_of(RunPaths(run_dir, nodes[0]), info.get("attempt"))
    if spec is not None and spec.nodes is not None:
        info["node_count"], info["endpoint"] = spec.nodes.count, spec.nodes.endpoint
    return info


def resume_from(paths: RunPaths) -> dict:
    """What ``rocm-yolo train --resume RUN`` would start from, changing nothing: the checkpoint, the epoch it trains
    (1-based) and the batches of it done (0 at an epoch's start); or, with no checkpoint to resume, why."""
    try:
        point = resume_point(paths.last)
    except UsageError as e:
        return {"checkpoint": None, "why": str(e)}
    except OSError as e:  # a checkpoint went away while it was read (a resume started meanwhile)
        return {"checkpoint": None, "why": f"cannot read {paths.weights}: {e.strerror or e}"}
    found: dict = {"checkpoint": str(point.path), "note": point.note}
    mid = next(((epoch, batch) for epoch, batch, path in paths.mid_checkpoints() if path == point.path), None)
    read = summary(point.path)
    if mid is not None:
        found["epoch"], found["batch"] = mid
    elif read is not None and read.epoch is not None and read.epoch >= 0:
        found["epoch"], found["batch"] = read.epoch + 2, 0  # its "epoch" is the last one completed, 0-based
    if read is not None and read.epochs:
        found["epochs"] = read.epochs
    return found


def _collect(paths: RunPaths, now: float) -> dict:
    run_dir = paths.run_dir
    hb = heartbeat.read(paths.heartbeat)
    sup = read_state(paths)
    known = sup or SupervisorState(state=RunState.RUNNING, profile=None)  # no record: nothing known of the supervisor
    info: dict = {
        "run_dir": str(run_dir),
        "state": sup.state.value if sup else "unknown",
        **{name: getattr(known, name) for name in TOLD},
        "hangs": len(known.hangs),
        "recoveries": [asdict(r) for r in known.recoveries],
        "failures": [asdict(f) for f in known.failures],
    }
    if sup is not None and sup.running and not alive(sup.supervisor_pid):
        info["state"] = "stopped"  # the supervisor is gone without writing a final state (killed -9?)
    if info["state"] == RunState.RUNNING.value:
        info.update(_trainer(sup, now))
    if hb is not None:
        spec = _spec_of(paths, hb.attempt)
        info.update(
            _heard(hb, HEARD, now),
            profile=getattr(spec, "profile", None) or info["profile"],  # the attempt's own
        )
        relaid = spec.relayout if spec is not None else None
        if relaid is not None and hb.world > 1 and hb.world != relaid.gpus:  # the GPUs the nodes that met have
            relaid = Relayout(relaid.layout, hb.world) if fits(relaid.layout, hb.world) else relaid
        if relaid is not None:
            info["world"] = {
                "run": relaid.layout.world,
                "now": relaid.gpus,
                "gpu_batch": relaid.gpu_batch,
                "micro_batches": relaid.serves,
                "images_a_step": relaid.layout.batch,
            }
        if info["state"] == RunState.RUNNING.value and hb.phase != "done" and _stalled(hb, sup, now):
            info["state"] = "stalled?"
        live = info["state"] in LIVE  # a speed and an ETA only while it trains
        if live and hb.it_s > 0 and hb.batches and hb.epochs and hb.phase == "train":
            left = (hb.batches - hb.batch) + (hb.epochs - hb.epoch) * hb.batches
            info["eta_seconds"] = round(left / hb.it_s)
    # a finished run: rank 0 says it; an earlier attempt's ranks (a run resumed on fewer GPUs) are not this one's
    done = hb is None or hb.phase == "done" or info["state"] == RunState.FINISHED.value  # a rank above 0 says no "done"
    ranks = _ranks(paths, now, hb.attempt) if not done else []
    if ranks:
        info["ranks"] = ranks
    return info


def _trainer(sup: SupervisorState | None, now: float) -> dict:
    """A running trainer stopped (its state, read now) or a start-up that has not moved (the supervisor's record),
    with the seconds it has been so; {} for one that moves."""
    found: dict = {}
    if sup is not None and sup.still is not None:
        found["still_seconds"] = round(max(now - sup.still.since, 0.0), 1)
        found["stopped"] = sup.still.stopped
    if sup is None or not sup.child_pid or not _child_of(sup.child_pid, sup.supervisor_pid):
        return found  # no trainer here (another machine's node, or gone): its record alone
    read = kernel_view.movement([sup.child_pid, sup.supervisor_pid])
    trainer, supervisor = read.get(sup.child_pid), read.get(sup.supervisor_pid)
    if supervisor is not None and supervisor.state in kernel_view.STOPPED:
        found = {"suspended": True}  # Ctrl-Z: the supervisor stopped the tree and itself (job control)
    elif trainer is not None and trainer.state in kernel_view.STOPPED:
        found["stopped"], found["trainer_state"] = True, trainer.state
    return found


def _child_of(pid: int, parent: int) -> bool:
    """Whether ``pid`` runs here as ``parent``'s child (a pid of another machine's node is not this one's)."""
    try:
        return psutil.Process(pid).ppid() == parent
    except psutil.Error:
        return False


def _spec_of(paths: RunPaths, attempt: int | None) -> RunSpec | None:
    if attempt is None:
        return None
    try:
        return RunSpec.load(paths.spec(attempt))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _ranks(paths: RunPaths, now: float, attempt: int) -> list[dict]:
    """A multi-GPU run's ranks above 0 (rank 0's heartbeat is the run's) of ``attempt``, each where last heard."""
    found = []
    for rank, path in paths.rank_heartbeats():
        hb = heartbeat.read(path)
        if hb is not None and hb.attempt == attempt:
            found.append({"rank": rank, **_heard(hb, RANK_HEARD, now)})
    return found


def _heard(hb: Heartbeat, names: tuple[str, ...], now: float) -> dict:
    """What ``status`` tells of a heartbeat: its fields ``names``, and its age."""
    return {**{name: getattr(hb, name) for name in names}, "heartbeat_age": round(now - hb.time, 1)}


def render(info: dict) -> str:
    if not info.get("nodes"):
        return _render(info)
    lines = [f"run:       {info['run_dir']}"]
    where = [f"rendezvous {info['endpoint']}"] if info.get("endpoint") else []
    where += [f"round {info['round']['number']}"] if info.get("round") else []
    count = info.get("node_count") or len(info["nodes"])
    lines.append(f"nodes:     {count}" + (f" ({', '.join(where)})" if where else ""))
    for node in info["nodes"]:
        own = _render(node).splitlines()[1:]  # its "run:" line is the run's
        lines.append(f"node {node['node']}:    {own[0].split(':', 1)[1].strip()}")
        lines += ["  " + line for line in own[1:]]
    if info.get("resume"):
        lines.append(_resume_line(info["resume"], info["run_dir"]))
    return "\n".join(lines)


def _render(info: dict) -> str:
    notes = [f"restarted {info['restarts']} times"] if info.get("restarts") else []
    notes += [info["detail"]] if info.get("detail") else []
    lines = [
        f"run:       {info['run_dir']}",
        f"state:     {info['state']}" + (f" ({'; '.join(notes)})" if notes else ""),
    ]
    done = info["state"] == RunState.FINISHED.value or info.get("phase") == "done"
    if "epoch" in info and done:  # its last batch and speed were the final validation's
        lines.append(f"progress:  done after epoch {info['epoch']}/{info['epochs']}")
    elif "epoch" in info:
        lines.append(
            f"progress:  epoch {info['epoch']}/{info['epochs']}, "
            f"{info['phase']} batch {info['batch']}/{info['batches']}"
        )
        if info["state"] in LIVE:  # a stopped run has no speed
            eta = info.get("eta_seconds")
            lines.append(f"speed:     {info['it_s']:.2f} it/s" + (f", ETA {_hms(eta)}" if eta is not None else ""))
    if "epoch" in info:
        lines.append(
            f"heartbeat: {info['heartbeat_age']:.0f} s ago (attempt {info['attempt']}, profile {info['profile']})"
        )
    if info.get("world"):
        lines.append(_world_line(info["world"]))
    if info.get("suspended"):
        lines.append("trainer:   stopped with its supervisor (Ctrl-Z): fg or bg continues both")
    elif info.get("stopped") or info.get("still_seconds") is not None:
        lines.append(f"trainer:   {_still_line(info)}")
    for r in info.get("ranks") or []:
        lines.append(
            f"rank {r['rank']}:    epoch {r['epoch']}, {r['phase']} batch {r['batch']}/{r['batches']}, "
            f"{r['heartbeat_age']:.0f} s ago (attempt {r['attempt']})"
        )
    if info.get("resume"):  # where it was heard last may be past what was saved
        lines.append(_resume_line(info["resume"], info["run_dir"]))
    lines.append(f"hangs:     {info['hangs']}, {info['lost_seconds']:.0f} s lost")
    for r in info.get("recoveries") or []:
        lines.append(f"restart:   {_recovery(r)}")
    for line in info.get("verdict") or []:
        lines.append(f"verdict:   {line.strip()}")
    return "\n".join(lines)


def _world_line(world: dict) -> str:
    """``world:     2 -> 1 GPU: 2 micro-batches of 8 a step on each, 16 images a step (the run's)``."""
    run, now, gpu, micro = world["run"], world["now"], world["gpu_batch"], world["micro_batches"]
    gpus = f"{now} GPU{'s' if now > 1 else ''}"
    if run == now:
        return f"world:     {gpus}, {gpu} images a step on each"
    each = f"{micro} micro-batches of {gpu} a step on each" if micro > 1 else f"{gpu} images a step on each"
    return f"world:     {run} -> {gpus}: {each}, {world['images_a_step']} images a step (the run's)"


def _still_line(info: dict) -> str:
    """``stopped (state T: SIGSTOP from outside) for 40 s``, or ``its start-up has not moved ... for 40 s``."""
    seconds = info.get("still_seconds")
    how_long = f" for {seconds:.0f} s" if seconds is not None else ""
    if info.get("stopped"):
        return (
            f"stopped (state {info.get('trainer_state', 'T')}: a SIGSTOP or a debugger, not rocm-yolo's Ctrl-Z)"
            f"{how_long}; kill -CONT continues it, the watchdog ends it after the stall timeout"
        )
    return f"its start-up has not moved (CPU time, I/O){how_long}: the watchdog ends it after the stall timeout"


def _resume_line(found: dict, run_dir: str) -> str:
    """``resume:    from epoch 2/3, batch 10 (weights/ep2-ba10.pt)``, or why a resume has nothing to start from."""
    if not found.get("checkpoint"):
        return f"resume:    none ({found.get('why')})"
    path = Path(found["checkpoint"])
    try:
        path = path.relative_to(run_dir)
    except ValueError:
        pass
    epoch = found.get("epoch")
    if epoch is None:
        return f"resume:    from {path}"
    of = f"{epoch}/{found['epochs']}" if found.get("epochs") else f"{epoch}"
    at = f"epoch {of}, batch {found['batch']:,}" if found.get("batch") else f"the start of epoch {of}"
    return f"resume:    from {at} ({path})"


def _recovery(r: dict) -> str:
    """One restart: what failed where, where the next attempt resumed and what it trained again."""

    def at(position):
        return f"epoch {position[0]}, batch {position[1]:,}" if position else "start-up"

    cause = r.get("cause") if not r.get("failure") else f"{r.get('cause')} ({r['failure']})"
    text = f"attempt {r.get('attempt')}: {cause} at {at(r.get('lost_at'))}"
    if r.get("resumed_at"):
        text += f", resumed at {at(r['resumed_at'])}" + (f" from {r['checkpoint']}" if r.get("checkpoint") else "")
    if r.get("retrained_batches") is not None:
        text += f", {r['retrained_batches']:,} batches trained again"
    seconds = [
        f"{r[k]:.0f} s {label}"
        for k, label in (
            ("detect_seconds", "to detect"),
            ("restart_seconds", "to restart"),
            ("retrain_seconds", "retraining"),
        )
        if r.get(k)
    ]
    return text + (f" ({', '.join(seconds)})" if seconds else "")


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def main(run_dir: str | None, as_json: bool = False) -> int:
    path = Path(run_dir) if run_dir else newest_run()
    if path is None:
        raise UsageError("no run found under runs/: pass the run directory, e.g. rocm-yolo status runs/detect/train")
    if not RunPaths(path, None).state.is_dir():
        raise UsageError(f"{path} is not a rocm-yolo run directory (no {STATE_DIRNAME}/ inside)")
    info = collect(path)
    print(json.dumps(info, indent=2) if as_json else render(info))
    return errors.OK
