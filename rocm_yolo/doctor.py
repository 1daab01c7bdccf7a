"""``rocm-yolo doctor``: find what makes a training run hang or crash, before it does.

Each check is one :class:`Row`: a status (✓ ok, ⚠ warning, ✗ blocks training, – skipped),
what was found, and the fix in words a user can act on. The checks themselves live in
:mod:`rocm_yolo.doctor_checks`; this module holds the row model, the command line, the
output (a table for people, ``--json`` for scripts) and the exit codes:

- ``0`` nothing blocks training (warnings allowed),
- ``1`` at least one ✗ row,
- ``2`` a usage error (e.g. a missing DATA file): one line on stderr, no traceback.

Like the CLI, this module never imports torch or Ultralytics: every check that needs them
runs in a subprocess under a timeout, so the doctor itself cannot hang or crash.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

from rocm_yolo.doctor_model import (  # noqa: F401 - re-exported for scripts and tests
    CHECKS, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, FAIL, OK, SKIP, SYMBOLS, WARN, Options, Row, _COLOURS,
)
from rocm_yolo.errors import UsageError
from rocm_yolo.profiles import PROFILES
from rocm_yolo.tasks import CLASSIFY, DETECT, OBB, POSE, SEGMENT

DATA_TASKS = (DETECT, SEGMENT, POSE, OBB, CLASSIFY)  # the tasks whose data the doctor checks

# ---------------------------------------------------------------------------------------
# command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the doctor's arguments to ``parser`` (the ``doctor`` subcommand of the CLI)."""
    parser.add_argument("data", nargs="?", metavar="DATA",
                        help="Ultralytics data YAML, or a class-per-folder directory for classification, to check (or 'demo')")
    parser.add_argument("--task", choices=DATA_TASKS, default=None,
                        help="check the data for this task (default: a directory is classify, a YAML with kpt_shape "
                        "pose, any other YAML detect: boxes or polygons)")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers to test (default: the profile's)")
    parser.add_argument("--batch", type=int, default=16, help="batch size for the shared-memory estimate and loader test (16)")
    parser.add_argument("--imgsz", type=int, default=640, help="training image size for the shared-memory estimate (640)")
    parser.add_argument("--profile", default="fast", help=f"settings profile to check against ({', '.join(PROFILES)}; default fast)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each subprocess step may take (120)")
    parser.add_argument("--skip", default="", help=f"comma-separated checks to leave out: {','.join(CHECKS)}")
    parser.add_argument("--rocm-path", default=None, help="ROCm installation (default $ROCM_PATH or /opt/rocm)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, for scripts")
    # hidden: fake trees for tests and for inspecting a mounted system image
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)
    parser.add_argument("--kfd-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--kernel-log", default=None, help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> Options:
    """Validate the parsed arguments; raises :class:`UsageError` with a one-line message."""
    skip = frozenset(x.strip() for x in (getattr(args, "skip", "") or "").split(",") if x.strip())
    unknown = skip - set(CHECKS)
    if unknown:
        raise UsageError(f"--skip: unknown check {', '.join(sorted(unknown))}: choose from {','.join(CHECKS)}")
    if args.workers is not None and args.workers < 0:
        raise UsageError(f"--workers {args.workers} must be >= 0")
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch} must be >= 1")
    if args.imgsz < 32:
        raise UsageError(f"--imgsz {args.imgsz} must be >= 32")
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g} must be > 0 seconds")
    if args.profile not in PROFILES:
        raise UsageError(f"unknown profile '{args.profile}': choose one of {', '.join(PROFILES)}")
    root = Path(getattr(args, "root", "/") or "/")
    if not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    data = None
    if args.data:
        data = Path(args.data).expanduser()
        if not data.exists() and args.data == "demo":
            from rocm_yolo.demo import write_demo

            data = write_demo()
        elif not data.exists():
            raise UsageError(f"data file not found: {args.data}")
    kernel_log = getattr(args, "kernel_log", None)
    return Options(
        data=data,
        task=getattr(args, "task", None),
        workers=args.workers,
        batch=args.batch,
        imgsz=args.imgsz,
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
    from rocm_yolo import doctor_checks

    rows: list[Row] = []
    for row in doctor_checks.run_all(opts):
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


# ---------------------------------------------------------------------------------------
# verdicts and output


def exit_code(rows: Iterable[Row]) -> int:
    return EXIT_PROBLEMS if any(r.status == FAIL for r in rows) else EXIT_OK


def conclusion(rows: list[Row]) -> str:
    """The one line a person would say after reading the rows."""
    fails = [r for r in rows if r.status == FAIL]
    warns = [r for r in rows if r.status == WARN]
    verdicts = [r.data["verdict"] for r in fails if r.data.get("verdict")]  # e.g. the DataLoader's
    if fails:
        names = ", ".join(r.name for r in fails[:4]) + (", ..." if len(fails) > 4 else "")
        head = verdicts[0] if verdicts else f"fix the ✗ rows first ({names})"
        n = len(fails)
        return f"{n} problem{'s' if n > 1 else ''} block{'' if n > 1 else 's'} training: {head}"
    tail = f" ({len(warns)} warning{'s' if len(warns) > 1 else ''} above)" if warns else ""
    return f"Nothing blocks training{tail}." if warns else "All checks passed: ready to train."


def _plain(value):
    """JSON-safe: NaN and infinities become None (strict JSON has no NaN)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def report_dict(rows: list[Row], verdict: str, code: int) -> dict:
    return _plain({
        "version": 1,
        "ok": code == EXIT_OK,
        "exit_code": code,
        "conclusion": verdict,
        "counts": {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL, SKIP)},
        "rows": [asdict(r) for r in rows],
    })


NAME_WIDTH = 20


def format_row(row: Row, colour: bool = False) -> list[str]:
    symbol = SYMBOLS[row.status]
    if colour:
        symbol = f"{_COLOURS[row.status]}{symbol}\033[0m"
    pad = " " * (NAME_WIDTH + 4)
    lines = [f"  {symbol} {row.name:<{NAME_WIDTH}} {row.found}"]
    lines += [f"{pad}  {d}" for d in row.details]
    if row.fix and row.status in (WARN, FAIL):
        lines.append(f"{pad}→ {row.fix}")
    return lines


def format_report(rows: list[Row], colour: bool = False) -> str:
    out = ["rocm-yolo doctor", ""]
    for row in rows:
        out += format_row(row, colour)
    code = exit_code(rows)
    out += ["", f"{SYMBOLS[FAIL] if code else SYMBOLS[OK]} {conclusion(rows)}"]
    return "\n".join(out)


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


if __name__ == "__main__":
    from rocm_yolo.doctor import main as _main  # one copy of the module, not __main__ and rocm_yolo.doctor

    raise SystemExit(_main())
