"""The doctor's options: what the user asked (:class:`DoctorRequest`, each option declared once: its flag, default and
help), and what the checks read (:class:`Options`, validated by :func:`rocm_yolo.doctor.cli.options`; its defaults
the request's), with what a training run with those options would load (:func:`loader_plan`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import PROFILES
from rocm_yolo.request.demo import DEMO_DEFAULTS
from rocm_yolo.request.train_request import TrainRequest
from rocm_yolo.ultralytics_rules import config as ucfg
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

DATA_TASKS = (DETECT, SEGMENT, POSE, OBB, CLASSIFY)  # the tasks whose data the doctor checks
CACHE_CHOICES = ("ram", "disk", "false")  # Ultralytics' cache= (True is ram)


def _option(help, *, default: object = None, **argparse_kwargs) -> dict:
    """A field's metadata: its help (``{default}``: the field's declared ``default``; ``{checks}``: the checks' names,
    filled in when the parser is built, as a callable help is worked out then), its parser options."""
    return {"help": help.format(default=default) if isinstance(help, str) else help, "argparse": argparse_kwargs}


def _declared(default: object, help: str, **argparse_kwargs):
    """An option with a default of its own: the field, its help saying the default."""
    return field(default=default, metadata=_option(help, default=default, **argparse_kwargs))


def train_sizes() -> dict:
    """Ultralytics' train defaults, batch and imgsz (its ``cfg/default.yaml``): the shared-memory estimate's."""
    return {key: ucfg.default(key) for key in ("batch", "imgsz")}


@dataclass(frozen=True)
class DoctorRequest:
    """What the user asked ``rocm-yolo doctor`` for, unvalidated: one field per option, listed once, its flag, type,
    default and help in the field's metadata (:func:`rocm_yolo.doctor.cli.add_arguments` builds the parser's options
    from them), as :class:`~rocm_yolo.request.train_request.TrainRequest` lists train's.
    :func:`rocm_yolo.doctor.cli.options` validates it into the :class:`Options` the checks read."""

    data: str | None = field(
        default=None,
        metadata=_option(
            "Ultralytics data YAML, or a class-per-folder directory for classification, to check (or 'demo')",
            flag="data",
            nargs="?",
            metavar="DATA",
        ),
    )
    task: str | None = field(
        default=None,
        metadata=_option(
            "check the data for this task (default: a directory is classify, a YAML with kpt_shape "
            "pose, any other YAML detect: boxes or polygons)",
            choices=DATA_TASKS,
        ),
    )
    workers: int | None = field(
        default=None, metadata=_option("DataLoader workers to test (default: the profile's)", type=int)
    )
    batch: int | None = field(
        default=None,
        metadata=_option(
            lambda: (
                f"batch size for the shared-memory estimate and loader test (default {_default('batch')}; "
                f"for demo: {DEMO_DEFAULTS['batch']})"
            ),
            type=int,
        ),
    )
    imgsz: int | None = field(
        default=None,
        metadata=_option(
            lambda: (
                f"training image size for the shared-memory estimate (default {_default('imgsz')}; "
                f"for demo: {DEMO_DEFAULTS['imgsz']})"
            ),
            type=int,
        ),
    )
    cache: str = _declared(
        "false",
        "the run's cache= (ram: Ultralytics' image cache counts in the shared-memory estimate; default {default})",
        choices=CACHE_CHOICES,
    )
    profile: str = _declared(  # the profile a run takes when it names none
        TrainRequest.default_of("profile"),
        f"settings profile to check against ({', '.join(PROFILES)}; default {{default}})",
    )
    timeout: float = _declared(120.0, "seconds each subprocess step may take ({default:g})", type=float)
    skip: str = field(default="", metadata=_option("comma-separated checks to leave out: {{checks}}"))
    rocm_path: str | None = field(default=None, metadata=_option("ROCm installation (default $ROCM_PATH or /opt/rocm)"))
    json: bool = field(default=False, metadata=_option("one JSON document on stdout, for scripts", action="store_true"))
    # hidden: fake trees for tests and for inspecting a mounted system image
    root: str = field(default="/", metadata=_option(argparse.SUPPRESS))
    kfd_root: str | None = field(default=None, metadata=_option(argparse.SUPPRESS))
    kernel_log: str | None = field(default=None, metadata=_option(argparse.SUPPRESS))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DoctorRequest":
        """The parsed command line (an option it lacks takes its default)."""
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})


def _default(key: str) -> object:
    """Ultralytics' default for the help text (its own name for it when Ultralytics cannot be read)."""
    try:
        return train_sizes()[key]
    except UsageError:
        return f"Ultralytics' {key}"


@dataclass
class Options:
    """Everything the checks need: the parsed arguments plus the injectable system roots (the defaults of those
    the user gives are :class:`DoctorRequest`'s)."""

    data: Path | None = None  # a dataset YAML, or a class-per-folder directory (classification)
    task: str | None = None  # what the data is checked for; None: what the data says (doctor.data.data_task)
    workers: int | None = None  # None: the profile's default
    batch: int = field(default_factory=lambda: train_sizes()["batch"])
    imgsz: int = field(default_factory=lambda: train_sizes()["imgsz"])
    cache: str = DoctorRequest.cache  # the run's cache=: "ram" counts Ultralytics' image cache in the shared memory
    profile: str = DoctorRequest.profile
    timeout: float = DoctorRequest.timeout  # per subprocess step (DataLoader: from the moment the data set is built)
    skip: frozenset = frozenset()
    root: Path = Path("/")  # file-system root for /dev, /opt/rocm, /etc/group (fake trees in tests)
    rocm_path: Path | None = None
    kfd_root: str | None = None  # passed to rocm_yolo.gpu.arch.detect_gpus
    kernel_log: Path | None = None  # read this file instead of dmesg / journalctl
    json: bool = False
    progress: bool = False  # progress bar on stderr
    python: str = sys.executable
    # identity of the user, None: the real one (tests pass a fake user for fake device trees)
    uid: int | None = None
    user: str | None = None
    groups: frozenset | None = None  # names of the groups of this session
    nofile: tuple[int, int] | None = None  # (soft, hard) RLIMIT_NOFILE
    cpus: int | None = None

    def path(self, absolute: str) -> Path:
        """``absolute`` (e.g. "/dev/kfd") under the configured root."""
        return self.root / absolute.lstrip("/")


def loader_plan(opts: Options) -> dict:
    """Workers, validation workers and prefetch a training run with these options would use."""
    from rocm_yolo.policy.profiles import resolve

    cpus = opts.cpus or os.cpu_count() or 1
    resolved = resolve(opts.profile, opts.workers, cpu_count=cpus)
    s = resolved.loader
    val_workers = s.val_workers if s.val_workers is not None else min(2 * s.workers, cpus)
    return {
        "workers": s.workers,
        "val_workers": val_workers if s.workers else 0,
        "prefetch": s.prefetch_factor or 0,
        "start_method": s.start_method,
        "warnings": list(resolved.warnings),
    }
