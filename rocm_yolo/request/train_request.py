"""A train request as the user gave it: one record, whether it came from ``rocm-yolo train`` or ``rocm_yolo.train()``.

Each option of the request is one field of :class:`TrainRequest`, listed once: its command-line flag, type, help
and default live in the field's metadata (:func:`add_arguments` builds the parser's options from them,
:meth:`TrainRequest.from_args` reads them back), and the Python API passes the same names as keywords
(:meth:`TrainRequest.from_kwargs`). A field is None when the user gave nothing (a resume then keeps the run's
own); what a new run takes then is the option's declared default (:meth:`TrainRequest.default_of`), which its help
says. The watchdog's options are declared with its settings (:class:`~rocm_yolo.supervisor.config.WatchdogConfig`:
their defaults, help and least values). Anything that is not a field is an Ultralytics train argument or a loader
setting (``KEY=VALUE``), kept in ``overrides``. The request is raw:
:func:`rocm_yolo.request.validation.make_spec` validates it into a run's spec, as ``torch.distributed.run`` goes
``config_from_args`` -> ``LaunchConfig`` -> ``elastic_launch``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from rocm_yolo import environment
from rocm_yolo.conv.strategies import AUTO as CONV_AUTO
from rocm_yolo.conv.strategies import CHOICES as CONV_STRATEGIES
from rocm_yolo.errors import UsageError, option
from rocm_yolo.policy.profiles import PROFILES, parse_ladder
from rocm_yolo.request.schedulers import Slurm
from rocm_yolo.supervisor.config import DEFAULTS as WATCHDOG
from rocm_yolo.supervisor.config import WatchdogConfig
from rocm_yolo.ultralytics_rules import config as ucfg


def _option(
    help: str, *, default: object = None, ultralytics: bool = False, group: str = "train", **argparse_kwargs
) -> dict:
    """A field's metadata: its help (``{default}`` filled in), its declared default (what a new run takes when the
    user gives nothing), whether Ultralytics also takes it as a train argument, its parser options."""
    return {
        "help": help.format(default=default),
        "default": default,
        "ultralytics": ultralytics,
        "group": group,
        "argparse": argparse_kwargs,
    }


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked ``rocm-yolo train`` (or ``rocm_yolo.train``) for, unvalidated."""

    data: str | None = None  # DATA: a dataset YAML, a class-per-folder directory, or 'demo' (positional)
    model: str | None = field(
        default=None,
        metadata=_option(
            "model .pt or .yaml (default: Ultralytics' yolo26n.pt; yolo26n.yaml for demo)", ultralytics=True
        ),
    )
    workers: Any = field(
        default=None, metadata=_option("DataLoader workers (default: the profile's)", ultralytics=True, metavar="N")
    )
    profile: str | None = field(
        default=None,
        metadata=_option(
            "settings profile (default: {default}; on resume: the run's)", default="fast", choices=list(PROFILES)
        ),
    )
    epochs: Any = field(default=None, metadata=_option("", ultralytics=True, type=int, metavar="N"))
    imgsz: Any = field(default=None, metadata=_option("", ultralytics=True, type=int, metavar="N"))
    batch: Any = field(
        default=None, metadata=_option("batch size (-1 for AutoBatch)", ultralytics=True, type=float, metavar="N")
    )
    device: Any = field(
        default=None,
        metadata=_option(
            "cpu, 0, 1, ..., or 0,1 for several GPUs (Ultralytics' DDP, one rank per GPU; batch divides by them) "
            "(default: Ultralytics' choice)",
            ultralytics=True,
            metavar="D",
        ),
    )
    project: str | None = field(
        default=None,
        metadata=_option("output directory (default: runs/TASK, e.g. runs/detect)", ultralytics=True, metavar="DIR"),
    )
    name: str | None = field(
        default=None,
        metadata=_option("run name (default: train, train-2, ...)", ultralytics=True, metavar="NAME"),
    )
    resume: Any = field(
        default=None,
        metadata=_option(
            "continue a run from its last.pt (default: the newest under the project)",
            nargs="?",
            const=True,
            metavar="LAST_PT",
        ),
    )
    conv: str | None = field(
        default=None,
        metadata=_option(
            "Conv2d strategy for GPUs whose MIOpen convolutions fail; miopen-off turns MIOpen off for the whole "
            "process (default: {default}: the fastest that passes a self-test)",
            default=CONV_AUTO,
            choices=CONV_STRATEGIES,
        ),
    )
    checkpoint_every: Any = field(
        default=None,
        metadata=_option(
            "write a mid-epoch checkpoint this often: 30s, 10m, 1h, 500ba (batches), or 0 for never "
            "(default: {default}; on resume: the run's); a hang then costs at most that much work",
            default="10m",
            metavar="INTERVAL",
        ),
    )
    watchdog: bool = field(
        default=True,
        metadata=_option(
            "no stall detection and no automatic restarts", group="watchdog", flag="--no-watchdog", action="store_false"
        ),
    )
    stall_timeout: Any = field(
        default=None,
        metadata=_option(WatchdogConfig.help("stall_timeout"), group="watchdog", type=float, metavar="SECONDS"),
    )
    startup_grace: Any = field(
        default=None,
        metadata=_option(WatchdogConfig.help("startup_grace"), group="watchdog", type=float, metavar="SECONDS"),
    )
    max_restarts: Any = field(
        default=None,
        metadata=_option(WatchdogConfig.help("max_restarts"), group="watchdog", type=int, metavar="N"),
    )
    fallback: Any = field(
        default=None,
        metadata=_option(WatchdogConfig.help("ladder"), group="watchdog", metavar="P1,P2,..."),
    )
    notify: Any = field(
        default=None,
        metadata=_option(WatchdogConfig.help("notify"), group="watchdog", metavar="CMD"),
    )
    nnodes: Any = field(
        default=None,
        metadata=_option(
            "machines the run trains on, each running this command with its own --node-rank (default: 1, or "
            f"{Slurm.NNODES}); the batch is the global batch, divided by all GPUs of all nodes. MIN:MAX: the run goes "
            "on without a lost node while at least MIN are left, each step's images kept, and a node that comes "
            "back joins at the next round",
            group="nodes",
            metavar="N|MIN:MAX",
        ),
    )
    node_rank: Any = field(
        default=None,
        metadata=_option(
            f"this machine's number, 0 to N-1 (default: {Slurm.NODEID}); its files go to RUN/rocm_yolo/node-K/",
            group="nodes",
            metavar="K",
        ),
    )
    rdzv_endpoint: Any = field(
        default=None,
        metadata=_option(
            "where the nodes meet (torch's c10d rendezvous), the same on every node (default: MASTER_ADDR:"
            "MASTER_PORT, else SLURM's first host; with no port given, the run draws its own, kept private)",
            group="nodes",
            metavar="HOST:PORT",
        ),
    )
    rdzv_timeout: Any = field(
        default=None,
        metadata=_option(
            "how long the nodes wait for each other at the rendezvous, at the start and after a failure; a node "
            "that does not come within it ends the run (default: {default})",
            default="10m",
            group="nodes",
            metavar="SECONDS",
        ),
    )
    overrides: Mapping[str, Any] = field(default_factory=dict)  # KEY=VALUE: Ultralytics train args, loader settings

    @classmethod
    def from_kwargs(cls, data: str | None = None, **kwargs: Any) -> "TrainRequest":
        """``rocm_yolo.train(data, workers=4, lr0=0.01, ...)``: the fields by name, every other keyword an override."""
        names = {f.name for f in fields(cls)} - {"data", "overrides"}
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        return cls(data=data, overrides=dict(kwargs), **given)

    @classmethod
    def from_args(cls, args: argparse.Namespace, extra: list[str] = ()) -> "TrainRequest":
        """The parsed command line: the fields, DATA, ``--resume`` and KEY=VALUE as the user meant them
        (``--resume KEY=VALUE``, or only KEY=VALUE given)."""
        overrides, data, resume = [*args.overrides, *extra], args.data, args.resume
        if data is not None and "=" in data:  # only KEY=VALUE given (e.g. with --resume)
            overrides.insert(0, data)
            data = None
        if isinstance(resume, str) and "=" in resume and not Path(resume).exists():  # --resume KEY=VALUE
            overrides.insert(0, resume)
            resume = True
        given = {f.name: getattr(args, f.name) for f in fields(cls) if "argparse" in f.metadata}
        request = cls(**given)
        batch = request.batch
        if isinstance(batch, float) and batch.is_integer():
            batch = int(batch)  # --batch 8 is 8, as batch=8 reads
        return replace(request, data=data, resume=resume, batch=batch, overrides=parse_key_values(overrides))

    @classmethod
    def default_of(cls, name: str) -> object:
        """What a new run takes for option ``name`` when the user gives nothing: its declared default."""
        return next(f for f in fields(cls) if f.name == name).metadata["default"]

    @property
    def resuming(self) -> bool:
        return self.resume is not None and self.resume is not False

    def watchdog_config(self) -> WatchdogConfig:
        """The watchdog this request asks for (:class:`WatchdogConfig`'s defaults where it says nothing)."""
        given = {
            k: getattr(self, k)
            for k in ("stall_timeout", "startup_grace", "max_restarts")
            if getattr(self, k) is not None
        }
        notify = self.notify if self.notify is not None else os.environ.get(environment.NOTIFY)
        config = WatchdogConfig(  # > 0 and finite
            enabled=self.watchdog, ladder=_ladder(self.fallback), notify=notify or None, **given
        )
        for key in ("stall_timeout", "startup_grace"):
            least = WatchdogConfig.minimum(key)
            if key in given and given[key] < least:
                raise UsageError(
                    f"{option(key, _plain(given[key]))} is too short: an epoch's end, a save or the start of a "
                    f"validation pass seconds without a heartbeat, which the watchdog would call a hang: give "
                    f"{option(key, _plain(least))} or more"
                )
        return config


def _plain(number: float) -> float | int:
    """``10.0`` as ``10``, as the user would write it."""
    return int(number) if float(number).is_integer() else number


ULTRALYTICS_FLAGS = tuple(f.name for f in fields(TrainRequest) if f.metadata.get("ultralytics"))


def _ladder(fallback: object) -> tuple[str, ...]:
    if fallback is None:
        return WATCHDOG.ladder
    if isinstance(fallback, str):
        return parse_ladder(fallback)
    if isinstance(fallback, (tuple, list)) and all(isinstance(x, str) for x in fallback):
        return parse_ladder(",".join(fallback))
    raise UsageError(f"fallback={fallback!r} must be profile names, e.g. 'fast,safe,threads,single'")


def parse_key_values(items: list[str]) -> dict[str, Any]:
    """``["epochs=3", "lr0=0.01"]`` -> ``{"epochs": 3, "lr0": 0.01}``, values as Ultralytics reads them."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"'{item}' is not KEY=VALUE: write e.g. lr0=0.01")
        if key in out:
            raise UsageError(f"'{key}' is given twice")
        out[key] = ucfg.smart_value(value.strip())
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rocm-yolo train``'s arguments, one per field of :class:`TrainRequest` (DATA and KEY=VALUE positional)."""
    parser.add_argument(
        "data",
        nargs="?",
        metavar="DATA",
        help="dataset YAML (for a -cls model: a directory of class folders), or 'demo' for the built-in demo set",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Ultralytics train arguments")
    groups = {
        "train": parser,
        "watchdog": parser.add_argument_group("watchdog"),
        "nodes": parser.add_argument_group("more than one machine (docs/multi-gpu.md)"),
    }
    for f in fields(TrainRequest):
        if "argparse" not in f.metadata:
            continue
        options = dict(f.metadata["argparse"])
        flag = options.pop("flag", "--" + f.name.replace("_", "-"))
        helptext = f.metadata["help"] or None
        groups[f.metadata["group"]].add_argument(flag, dest=f.name, help=helptext, default=f.default, **options)
