"""``rocm-yolo doctor``: its command line, its options listed once (:class:`DoctorRequest`; the checks and their order:
:mod:`.checks`).

Exit codes: ``0`` nothing blocks training (warnings allowed), ``1`` at least one ✗ row, ``2``
a usage error (e.g. a missing DATA file): one line on stderr, no traceback. Like the CLI,
this never imports torch or Ultralytics: every check that needs them runs in a subprocess
under a timeout, so the doctor itself cannot hang or crash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

from rocm_yolo.doctor import checks
from rocm_yolo.doctor.report import (
    EXIT_USAGE,
    FAIL,
    OK,
    SYMBOLS,
    Options,
    Row,
    conclusion,
    exit_code,
    format_row,
    report_dict,
    train_sizes,
)
from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import DEFAULT_PROFILE, PROFILES
from rocm_yolo.request.demo import DEMO_DEFAULTS
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

DATA_TASKS = (DETECT, SEGMENT, POSE, OBB, CLASSIFY)  # the tasks whose data the doctor checks
CACHE_CHOICES = ("ram", "disk", "false")  # Ultralytics' cache= (True is ram)


def _option(help, **argparse_kwargs) -> dict:
    """A field's metadata: its help (a callable: worked out when the parser is built), its parser options."""
    return {"help": help, "argparse": argparse_kwargs}


@dataclass(frozen=True)
class DoctorRequest:
    """What the user asked ``rocm-yolo doctor`` for, unvalidated: one field per option, listed once, its flag, type
    and help in the field's metadata (:func:`add_arguments` builds the parser's options from them), as
    :class:`~rocm_yolo.request.train_request.TrainRequest` lists train's. :meth:`options` validates it into the
    :class:`~rocm_yolo.doctor.report.Options` the checks read."""

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
    cache: str = field(
        default="false",
        metadata=_option(
            "the run's cache= (ram: Ultralytics' image cache counts in the shared-memory estimate; default false)",
            choices=CACHE_CHOICES,
        ),
    )
    profile: str = field(
        default=DEFAULT_PROFILE,
        metadata=_option(f"settings profile to check against ({', '.join(PROFILES)}; default {DEFAULT_PROFILE})"),
    )
    timeout: float = field(default=120.0, metadata=_option("seconds each subprocess step may take (120)", type=float))
    skip: str = field(default="", metadata=_option(f"comma-separated checks to leave out: {','.join(checks.NAMES)}"))
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

    def options(self) -> Options:
        """Validate the request into the checks' options; raises :class:`UsageError` with a one-line message."""
        skip = frozenset(x.strip() for x in (self.skip or "").split(",") if x.strip())
        unknown = skip - set(checks.NAMES)
        if unknown:
            raise UsageError(
                f"--skip: unknown check {', '.join(sorted(unknown))}: choose from {','.join(checks.NAMES)}"
            )
        if self.workers is not None and self.workers < 0:
            raise UsageError(f"--workers {self.workers} must be >= 0")
        sizes = DEMO_DEFAULTS if self.data == "demo" else train_sizes()  # what the training run would use
        batch = sizes["batch"] if self.batch is None else self.batch
        imgsz = sizes["imgsz"] if self.imgsz is None else self.imgsz
        if batch < 1:
            raise UsageError(f"--batch {batch} must be >= 1")
        if imgsz < 32:
            raise UsageError(f"--imgsz {imgsz} must be >= 32")
        if not math.isfinite(self.timeout) or self.timeout <= 0:
            raise UsageError(f"--timeout {self.timeout:g}: give a finite number of seconds > 0, e.g. --timeout 120")
        if self.profile not in PROFILES:
            raise UsageError(f"unknown profile '{self.profile}': choose one of {', '.join(PROFILES)}")
        root = Path(self.root or "/")
        if not root.is_dir():
            raise UsageError(f"--root {root}: not a directory")
        if self.rocm_path and not Path(self.rocm_path).expanduser().is_dir():
            raise UsageError(
                f"--rocm-path {self.rocm_path}: no such directory: give where ROCm is installed (e.g. /opt/rocm), or "
                "leave it out ($ROCM_PATH, else /opt/rocm)"
            )
        return Options(
            data=self._data(),
            task=self.task,
            workers=self.workers,
            batch=batch,
            imgsz=imgsz,
            cache=self.cache or "false",
            profile=self.profile,
            timeout=float(self.timeout),
            skip=skip,
            root=root,
            rocm_path=Path(self.rocm_path) if self.rocm_path else None,
            kfd_root=self.kfd_root,
            kernel_log=Path(self.kernel_log) if self.kernel_log else None,
            json=bool(self.json),
            progress=not self.json and sys.stderr.isatty(),
        )

    def _data(self) -> Path | None:
        if not self.data:
            return None
        data = Path(self.data).expanduser()
        if not data.exists() and self.data == "demo":
            from rocm_yolo.request.demo import write_demo

            return write_demo()
        if not data.exists():
            from rocm_yolo.request.data_path import near, shipped_dataset

            why = (
                f"{self.data} is a data set Ultralytics downloads by name when a training starts, and the doctor "
                "checks data on disk: give the path of its download"
                if shipped_dataset(self.data)
                else "give the path of the dataset YAML you will train on (a directory of class folders for "
                "classification), or 'demo'"
            )
            raise UsageError(f"data file not found: {self.data}{near(data)}: {why}")
        return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``parser`` (the ``doctor`` subcommand of the CLI): one per field of
    :class:`DoctorRequest`."""
    for f in fields(DoctorRequest):
        options = dict(f.metadata["argparse"])
        flag = options.pop("flag", "--" + f.name.replace("_", "-"))
        helptext = f.metadata["help"]
        parser.add_argument(flag, default=f.default, help=helptext() if callable(helptext) else helptext, **options)


def _default(key: str) -> object:
    """Ultralytics' default for the help text (its own name for it when Ultralytics cannot be read)."""
    try:
        return train_sizes()[key]
    except UsageError:
        return f"Ultralytics' {key}"


def options_from_args(args: argparse.Namespace) -> Options:
    """Validate the parsed arguments; raises :class:`UsageError` with a one-line message."""
    return DoctorRequest.from_args(args).options()


def run(args: argparse.Namespace) -> int:
    """Run the doctor for parsed ``args``; print the report and return the exit code."""
    try:
        opts = options_from_args(args)
    except UsageError as e:
        print(f"rocm-yolo doctor: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    rows = diagnose(opts, on_row=None if opts.json else _printer())
    code = exit_code(rows)
    verdict = conclusion(rows)
    if opts.json:
        print(json.dumps(report_dict(rows, verdict, code), indent=2, ensure_ascii=False, allow_nan=False))
    else:
        print()
        print(f"{SYMBOLS[FAIL] if code else SYMBOLS[OK]} {verdict}", flush=True)
    return code


def diagnose(opts: Options, on_row=None) -> list[Row]:
    """Run every check not skipped; ``on_row(row)`` is called as each row is ready."""
    rows: list[Row] = []
    for row in checks.run_all(opts):
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _printer():
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print("rocm-yolo doctor\n", flush=True)

    def on_row(row: Row) -> None:
        print("\n".join(format_row(row, colour)), flush=True)

    return on_row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocm-yolo doctor",
        description="Check this machine, its GPU, its shared memory, a data set and its DataLoader before training.",
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
