"""``rocm-yolo doctor``: its command line (the checks and their order: :mod:`.checks`).

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
from rocm_yolo.launch.demo import DEMO_DEFAULTS
from rocm_yolo.run.profiles import DEFAULT_PROFILE, PROFILES
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

DATA_TASKS = (DETECT, SEGMENT, POSE, OBB, CLASSIFY)  # the tasks whose data the doctor checks
CACHE_CHOICES = ("ram", "disk", "false")  # Ultralytics' cache= (True is ram)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``parser`` (the ``doctor`` subcommand of the CLI)."""
    parser.add_argument(
        "data",
        nargs="?",
        metavar="DATA",
        help="Ultralytics data YAML, or a class-per-folder directory for classification, to check (or 'demo')",
    )
    parser.add_argument(
        "--task",
        choices=DATA_TASKS,
        default=None,
        help="check the data for this task (default: a directory is classify, a YAML with kpt_shape "
        "pose, any other YAML detect: boxes or polygons)",
    )
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers to test (default: the profile's)")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help=f"batch size for the shared-memory estimate and loader test (default {_default('batch')}; "
        f"for demo: {DEMO_DEFAULTS['batch']})",
    )
    parser.add_argument(
        "--imgsz",
        type=int,
        default=None,
        help=f"training image size for the shared-memory estimate (default {_default('imgsz')}; "
        f"for demo: {DEMO_DEFAULTS['imgsz']})",
    )
    parser.add_argument(
        "--cache",
        choices=CACHE_CHOICES,
        default="false",
        help="the run's cache= (ram: Ultralytics' image cache counts in the shared-memory estimate; default false)",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"settings profile to check against ({', '.join(PROFILES)}; default {DEFAULT_PROFILE})",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each subprocess step may take (120)")
    parser.add_argument("--skip", default="", help=f"comma-separated checks to leave out: {','.join(checks.NAMES)}")
    parser.add_argument("--rocm-path", default=None, help="ROCm installation (default $ROCM_PATH or /opt/rocm)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, for scripts")
    # hidden: fake trees for tests and for inspecting a mounted system image
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    parser.add_argument("--kfd-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kernel-log", default=None, help=argparse.SUPPRESS)


def _default(key: str) -> object:
    """Ultralytics' default for the help text (its own name for it when Ultralytics cannot be read)."""
    try:
        return train_sizes()[key]
    except UsageError:
        return f"Ultralytics' {key}"


def options_from_args(args: argparse.Namespace) -> Options:
    """Validate the parsed arguments; raises :class:`UsageError` with a one-line message."""
    skip = frozenset(x.strip() for x in (getattr(args, "skip", "") or "").split(",") if x.strip())
    unknown = skip - set(checks.NAMES)
    if unknown:
        raise UsageError(f"--skip: unknown check {', '.join(sorted(unknown))}: choose from {','.join(checks.NAMES)}")
    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers {args.workers} must be >= 0")
    sizes = DEMO_DEFAULTS if args.data == "demo" else train_sizes()  # what the training run would use
    batch = sizes["batch"] if args.batch is None else args.batch
    imgsz = sizes["imgsz"] if args.imgsz is None else args.imgsz
    if batch < 1:
        raise UsageError(f"--batch {batch} must be >= 1")
    if imgsz < 32:
        raise UsageError(f"--imgsz {imgsz} must be >= 32")
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: give a finite number of seconds > 0, e.g. --timeout 120")
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile '{args.profile}': choose one of {', '.join(PROFILES)}")
    root = Path(getattr(args, "root", "/") or "/")
    if not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    data = None
    if args.data:
        data = Path(args.data).expanduser()
        if not data.exists() and args.data == "demo":
            from rocm_yolo.launch.demo import write_demo

            data = write_demo()
        elif not data.exists():
            raise UsageError(f"data file not found: {args.data}")
    kernel_log = getattr(args, "kernel_log", None)
    return Options(
        data=data,
        task=getattr(args, "task", None),
        workers=args.workers,
        batch=batch,
        imgsz=imgsz,
        cache=getattr(args, "cache", "false") or "false",
        profile=args.profile,
        timeout=float(args.timeout),
        skip=skip,
        root=root,
        rocm_path=Path(args.rocm_path) if getattr(args, "rocm_path", None) else None,
        kfd_root=getattr(args, "kfd_root", None),
        kernel_log=Path(kernel_log) if kernel_log else None,
        json=bool(args.json),
        progress=not args.json and sys.stderr.isatty(),
    )


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
