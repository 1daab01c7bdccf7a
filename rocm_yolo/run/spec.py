"""RunSpec: everything the training child needs, in one frozen, JSON-serialisable record.

The CLI (or the Python API) builds a spec from the profile, flags and KEY=VALUE arguments;
the supervisor writes it into the run directory and starts ``python -m rocm_yolo.trainer
SPEC.json`` (on several GPUs ``python -m rocm_yolo.ddp SPEC.json``, whose ranks each read it). Nothing
reaches the child by accident: what it needs travels here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from rocm_yolo.errors import UsageError
from rocm_yolo.run.atomic import private_dirs, write_atomic
from rocm_yolo.run.devices import Layout, Relayout, world_size
from rocm_yolo.run.nodes import Nodes
from rocm_yolo.run.paths import RunPaths


@dataclass(frozen=True)
class LoaderSettings:
    """What the DataLoader patch applies: the merged, validated result for one run."""

    workers: int
    val_workers: int | None  # None: leave Ultralytics' 2 x workers
    persistent_workers: bool
    prefetch_factor: int | None
    pin_memory: bool | None
    timeout: float
    start_method: str = (
        "forkserver"  # a fork server with torch and Ultralytics preloaded (rocm_yolo.trainer.forkserver.server)
    )
    threads: int = 0  # with workers=0: loader threads in the trainer process (profile threads); 0: the main thread

    @classmethod
    def user_keys(cls) -> frozenset[str]:
        """The settings a user gives as KEY=VALUE (:data:`rocm_yolo.policy.profiles.LOADER_SETTINGS` reads each): all
        but the workers, an option of their own."""
        return frozenset(f.name for f in fields(cls)) - {"workers"}

    @property
    def fork_server(self) -> bool:
        """Whether the loaders' workers come from the preloaded fork server."""
        return bool(self.workers) and self.start_method == "forkserver"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "LoaderSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})  # a key an older rocm-yolo wrote is dropped

    def describe(self, workers: int | None = None) -> str:
        """One line: what a loader with ``workers`` workers really uses."""
        workers = self.workers if workers is None else workers
        if workers == 0 and self.threads:
            return (
                f"workers=0 threads={self.threads} (in the trainer process) prefetch={self.prefetch_factor} "
                f"pin_memory={'auto' if self.pin_memory is None else str(self.pin_memory).lower()} "
                f"timeout={self.timeout:g}"
            )
        if workers == 0:
            return "workers=0 (in the main process)"
        pin = "auto" if self.pin_memory is None else str(self.pin_memory).lower()
        return (
            f"workers={workers} start={self.start_method} persistent={str(self.persistent_workers).lower()} "
            f"prefetch={self.prefetch_factor} pin_memory={pin} timeout={self.timeout:g}"
        )


@dataclass(frozen=True)
class RunSpec:
    data: str
    model: str
    run_dir: str
    profile: str
    loader: LoaderSettings
    val: bool
    train_args: dict  # Ultralytics train arguments (epochs, imgsz, batch, device, user KEY=VALUE, ...)
    user_keys: tuple[str, ...] = ()  # keys the user set explicitly (presets never override them)
    env: dict = field(default_factory=dict)  # environment the profile sets (user's own variables win)
    resume: str | None = None  # checkpoint to resume from
    # a spec made or read without these (by hand, by an older rocm-yolo) holds their options' defaults (TrainRequest)
    conv: str = "auto"
    checkpoint_every: str = "10m"  # mid-epoch checkpoints: Ns, Nm, Nh, Nba or 0 (run.midepoch_state)
    attempt: int = 1
    workers_requested: int | None = None  # what the user asked for, before a profile's cap or divisor
    notes: tuple[str, ...] = ()  # lines for the header (e.g. warnings from resolving the profile)
    created: bool = False  # this run created its directory (clean-up after a usage error touches only such a one)
    nodes: Nodes | None = None  # on more than one machine: the nodes, this one's id, the rendezvous and its round
    layout: dict | None = None  # the run's ranks and each one's batch (run.devices.Layout), kept by every attempt

    @property
    def run_layout(self) -> Layout | None:
        """The run's :class:`~rocm_yolo.run.devices.Layout`, when known (not before AutoBatch chose a batch)."""
        return Layout.from_dict(self.layout)

    @property
    def relayout(self) -> Relayout | None:
        """The run's layout on this attempt's GPUs (every node's), when the run's layout is known."""
        layout = self.run_layout
        return Relayout(layout, world_size(self.train_args, self.nodes)) if layout is not None else None

    @property
    def node(self) -> int | None:
        """rocm-yolo's id of this node on more than one machine, else None."""
        return self.nodes.node if self.nodes is not None else None

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.run_dir, self.node)

    @property
    def extended_epochs(self) -> int | None:
        """The epochs a resume trains the run on to (``--resume RUN --epochs N``), or None: the run's own."""
        return self.train_args.get("epochs") if self.resume and "epochs" in self.user_keys else None

    def with_changes(self, **changes) -> "RunSpec":
        return replace(self, **changes)

    def with_profile(self, profile: str, resolve: Resolve, say: Callable[[str], object] | None = None) -> "RunSpec":
        """This spec on ``profile``, what the user set carried over (:func:`carry_over`, with ``resolve``: the
        profiles' policy); the same spec when it is on ``profile`` already (the last rung repeats: the user's overrides
        included). ``say`` hears the line that names the user's settings ``profile`` cannot take, if any."""
        if profile == self.profile:
            return self
        carried = carry_over(self, profile, resolve)
        if carried.dropped and say is not None:
            say(carried.note(profile))
        resolved = resolve(profile, carried.workers, carried.loader, val=carried.val)
        return replace(
            self,
            profile=profile,
            loader=resolved.loader,
            val=resolved.val,
            env=resolved.env,
            user_keys=carried.user_keys,
        )

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        """A spec from its JSON; fields another rocm-yolo version added are ignored, missing ones take defaults."""
        d = json.loads(text)
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        loader_names = {f.name for f in fields(LoaderSettings)}
        d["loader"] = LoaderSettings.from_dict({k: v for k, v in d["loader"].items() if k in loader_names})
        d["user_keys"] = tuple(d.get("user_keys", ()))
        d["notes"] = tuple(d.get("notes", ()))
        d["nodes"] = Nodes.from_dict(d["nodes"]) if d.get("nodes") else None
        return cls(**d)

    def save(self) -> Path:
        """Write ``spec-<attempt>.json`` into the run's state directory and return its path."""
        path = self.paths.spec(self.attempt)
        private_dirs(self.paths.state, self.paths.node_dir)  # the user's alone: a spec sets the trainer's environment
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunSpec":
        return cls.from_json(Path(path).read_text())


def latest_spec(run_dir: str | os.PathLike, node: int | None = None) -> RunSpec | None:
    """The spec of the newest attempt recorded in ``run_dir`` (by ``node``, on more than one machine), if rocm-yolo
    made that run and it can be read."""
    for path in reversed(RunPaths(run_dir, node).specs()):
        try:
            return RunSpec.load(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return None


def next_attempt(run_dir: str | os.PathLike, node: int | None = None) -> int:
    """The number of the next attempt in ``run_dir`` (of ``node``, on more than one machine): after every spec file
    there, readable or not (a new attempt never overwrites another's spec, crash or stack files)."""
    specs = RunPaths(run_dir, node).specs()
    return int(specs[-1].stem[len("spec-") :]) + 1 if specs else 1


@dataclass(frozen=True)
class CarriedSettings:
    """The user's settings of a run's previous attempt that the next one keeps (see :func:`carry_over`)."""

    workers: int | None  # the user's request (a profile's cut is never cut again)
    loader: dict  # the user's loader settings the next profile can take
    val: bool | None  # the user's val=, if given
    conv: str | None  # the user's --conv, if given
    checkpoint_every: str
    user_keys: tuple[str, ...]  # the keys the user set that still hold
    dropped: tuple[str, ...] = ()  # the user's loader settings the next profile cannot take

    def note(self, profile: str) -> str | None:
        if not self.dropped:
            return None
        return f"profile '{profile}' cannot take {', '.join(f'{k}=' for k in self.dropped)}: dropped"


# How a profile's settings are resolved (:func:`rocm_yolo.policy.profiles.resolve`, the policy, given by the caller):
# ``resolve(profile, workers, loader_settings, val=...)``, a ``Resolved`` with ``loader``, ``val`` and ``env``, or a
# UsageError for a setting the profile cannot take.
Resolve = Callable[..., Any]


def carry_over(previous: RunSpec, profile: str, resolve: Resolve) -> CarriedSettings:
    """The one rule of what carries from an attempt to the next on ``profile``: a watchdog restart down the
    ladder and a user's ``--resume`` both follow it (``resolve``: the profiles' policy).

    Everything the user set carries over, as the user set it (what the user passes wins over a
    profile's defaults): the workers asked for (the next profile cuts them as it does, from the
    request, never from a cut count), ``val=``, ``--conv``, the checkpoint interval, and each
    loader setting the next profile can take; one it cannot (``prefetch_factor`` on a profile
    without workers) is dropped, and :meth:`CarriedSettings.note` says so.
    """
    workers = previous.loader.workers if previous.workers_requested is None else previous.workers_requested
    kept: dict = {}
    dropped = []
    for key in sorted(LoaderSettings.user_keys() & set(previous.user_keys)):
        value = getattr(previous.loader, key)
        try:
            resolve(profile, workers, {**kept, key: value})
        except UsageError:
            dropped.append(key)
            continue
        kept[key] = value
    return CarriedSettings(
        workers=workers,
        loader=kept,
        val=previous.val if "val" in previous.user_keys else None,
        conv=previous.conv if "conv" in previous.user_keys else None,
        checkpoint_every=previous.checkpoint_every,
        user_keys=tuple(k for k in previous.user_keys if k not in dropped),
        dropped=tuple(dropped),
    )
