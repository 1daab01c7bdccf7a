"""``rocm-yolo doctor``: its command line (the options: :class:`~rocm_yolo.doctor.options.DoctorRequest`, each
declared once; the checks and their order: :mod:`.checks`), and the request validated into the checks' options
(:func:`options`).

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
from dataclasses import fields
from pathlib import Path

from rocm_yolo.doctor import checks
from rocm_yolo.doctor.options import DoctorRequest, Options, train_sizes
from rocm_yolo.doctor.report import EXIT_USAGE, FAIL, OK, SYMBOLS, Row, conclusion, exit_code, format_row, report_dict
from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import PROFILES
from rocm_yolo.request.demo import DEMO_DEFAULTS


def options(request: DoctorRequest) -> Options:
    """Validate ``request`` into the checks' options; raises :class:`UsageError` with a one-line message."""
    skip = frozenset(x.strip() for x in (request.skip or "").split(",") if x.strip())
    unknown = skip - set(checks.NAMES)
    if unknown:
        raise UsageError(f"--skip: unknown check {', '.join(sorted(unknown))}: choose from {','.join(checks.NAMES)}")
    if request.workers is not None and request.workers < 0:
        raise UsageError(f"--workers {request.workers} must be >= 0")
    sizes = DEMO_DEFAULTS if request.data == "demo" else train_sizes()  # what the training run would use
    batch = sizes["batch"] if request.batch is None else request.batch
    imgsz = sizes["imgsz"] if request.imgsz is None else request.imgsz
    if batch < 1:
        raise UsageError(f"--batch {batch} must be >= 1")
    if imgsz < 32:
        raise UsageError(f"--imgsz {imgsz} must be >= 32")
    if not math.isfinite(request.timeout) or request.timeout <= 0:
        raise UsageError(f"--timeout {request.timeout:g}: give a finite number of seconds > 0, e.g. --timeout 120")
    if request.profile not in PROFILES:
        raise UsageError(f"unknown profile '{request.profile}': choose one of {', '.join(PROFILES)}")
    root = Path(request.root or "/")
    if not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    if request.rocm_path and not Path(request.rocm_path).expanduser().is_dir():
        raise UsageError(
            f"--rocm-path {request.rocm_path}: no such directory: give where ROCm is installed (e.g. /opt/rocm), or "
            "leave it out ($ROCM_PATH, else /opt/rocm)"
        )
    return Options(
        data=_data(request),
        task=request.task,
        workers=request.workers,
        batch=batch,
        imgsz=imgsz,
        cache=request.cache or "false",
        profile=request.profile,
        timeout=float(request.timeout),
        skip=skip,
        root=root,
        rocm_path=Path(request.rocm_path) if request.rocm_path else None,
        kfd_root=request.kfd_root,
        kernel_log=Path(request.kernel_log) if request.kernel_log else None,
        json=bool(request.json),
        progress=not request.json and sys.stderr.isatty(),
    )


def _data(request: DoctorRequest) -> Path | None:
    if not request.data:
        return None
    data = Path(request.data).expanduser()
    if not data.exists() and request.data == "demo":
        from rocm_yolo.request.demo import write_demo

        return write_demo()
    if not data.exists():
        from rocm_yolo.request.data_path import near, shipped_dataset

        why = (
            f"{request.data} is a data set Ultralytics downloads by name when a training starts, and the doctor "
            "checks data on disk: give the path of its download"
            if shipped_dataset(request.data)
            else "give the path of the dataset YAML you will train on (a directory of class folders for "
            "classification), or 'demo'"
        )
        raise UsageError(f"data file not found: {request.data}{near(data)}: {why}")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``parser`` (the ``doctor`` subcommand of the CLI): one per field of
    :class:`DoctorRequest`."""
    for f in fields(DoctorRequest):
        options = dict(f.metadata["argparse"])
        flag = options.pop("flag", "--" + f.name.replace("_", "-"))
        helptext = f.metadata["help"]
        helptext = (helptext() if callable(helptext) else helptext).replace("{checks}", ",".join(checks.NAMES))
        parser.add_argument(flag, default=f.default, help=helptext, **options)


def options_from_args(args: argparse.Namespace) -> Options:
    """Validate the parsed arguments; raises :class:`UsageError` with a one-line message."""
    return options(DoctorRequest.from_args(args))


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
