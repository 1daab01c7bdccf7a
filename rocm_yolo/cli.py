"""``rocm-yolo``: the command line. Parses, validates, hands over to the supervisor.

This process never imports torch or ultralytics: ``--help`` answers at once, and the
training child is started fresh rather than forked from a process holding GPU state.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from rocm_yolo import errors, triage
from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import PROFILES
from rocm_yolo.version import __version__

EPILOG = errors.HELP


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit code 2 (no usage dump, no traceback)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(errors.USAGE, f"rocm-yolo: error: {message} (see '{self.prog} --help')\n")


def _add_train(sub) -> None:
    from rocm_yolo.policy.profiles import LOADER_SETTINGS
    from rocm_yolo.request.train_request import add_arguments

    p = sub.add_parser(
        "train",
        help="train a YOLO model (DataLoader workers from a fork server, profiles, watchdog, resume)",
        description="Run Ultralytics training in a child process of its own, whose DataLoader workers fork from a "
        "preloaded fork server that never touched the GPU, under a watchdog that finds what failed and restarts "
        "from the newest checkpoint (mid-epoch or last.pt): on a safer loader profile after a loader hang, on the "
        "same one after a GPU fault.",
        epilog=EPILOG + ". Any other Ultralytics train argument goes as KEY=VALUE (e.g. lr0=0.01 cache=ram); "
        f"loader settings too: {', '.join(k + '=' for k in LOADER_SETTINGS)} (start_method=: forkserver, spawn or "
        "fork; threads=: the loader threads of --profile threads).",
    )
    add_arguments(p)


def build_parser() -> Parser:
    parser = Parser(
        prog="rocm-yolo", description="Dependable Ultralytics YOLO training on AMD GPUs with ROCm.", epilog=EPILOG
    )
    parser.add_argument("--version", action="version", version=f"rocm-yolo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_train(sub)
    parser.commands = sub.choices  # each command's own parser: its errors point to its own --help
    sub.add_parser("profiles", help="list the settings profiles with every setting")
    st = sub.add_parser("status", help="progress and health of a run (readable while it trains)")
    st.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="run directory (default: the newest under runs/)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    doc = sub.add_parser("doctor", help="find the cause of a hang before spending GPU hours")
    from rocm_yolo.doctor.cli import add_arguments

    add_arguments(doc)
    return parser


def cmd_profiles(args) -> int:
    names = list(PROFILES)
    rows = {name: dict(PROFILES[name].rows()) for name in names}
    keys = list(rows[names[0]])
    width = max(len(k) for k in keys) + 2
    col = max(len(v) for r in rows.values() for v in r.values()) + 2
    print("setting".ljust(width) + "".join(n.ljust(col) for n in names))
    for key in keys:
        print(key.ljust(width) + "".join(rows[n][key].ljust(col) for n in names))
    print()
    for name in names:
        print(f"{name}: {PROFILES[name].summary}")
    return errors.OK


def cmd_train(args, extra: list[str]) -> int:
    from rocm_yolo.request import TrainRequest, prepare, supervise

    request = TrainRequest.from_args(args, extra)
    config = request.watchdog_config()  # its errors before anything is claimed
    spec = prepare(request)
    result = supervise(spec, config, user_resume=request.resuming)  # it says how the run ended
    if request.data == "demo" and result.exit_code == errors.OK:
        from rocm_yolo.process.output import show

        show(DEMO_NEXT + "\n")
    return result.exit_code


DEMO_NEXT = """\
rocm-yolo: the demo's scores (P, R, mAP) stay near 0 after a few epochs on its 32 toy images: expected; it shows
that training, validation and checkpoints work on this machine. Next:
  rocm-yolo train data.yaml --device 0         your own data set (a YOLO dataset YAML), on the first GPU
  rocm-yolo status                             the newest run's progress and health, also while it trains
  rocm-yolo train --resume                     continue the newest stopped run where it stopped
  rocm-yolo doctor data.yaml                   check this machine and a data set before spending GPU hours"""


def cmd_status(args) -> int:
    from rocm_yolo import status

    return status.main(args.run_dir, as_json=args.json)


def _join_option_values(parser: Parser, argv: list[str]) -> list[str]:
    """``--checkpoint-every -1m`` -> ``--checkpoint-every=-1m``, ``--device -1,-1`` -> ``--device=-1,-1``: argparse
    takes a value that starts with ``-`` (and is no plain negative number) for an option and says only "expected one
    argument"; joined, the value reaches the check that says what is wrong."""
    takes_value = {
        option
        for sub in [parser, *parser.commands.values()]
        for action in sub._actions
        if action.nargs is None and action.option_strings and not isinstance(action, argparse._StoreConstAction)
        for option in action.option_strings
    }
    known = {o for sub in [parser, *parser.commands.values()] for a in sub._actions for o in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        arg, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if arg in takes_value and value is not None and value.startswith("-") and value.split("=")[0] not in known:
            out.append(f"{arg}={value}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _unrecognized(parser: Parser, stray: list[str]) -> None:
    """The unknown arguments, with the option meant where one is close (``--epocs`` -> ``--epochs``)."""
    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    close = [m for x in stray if x.startswith("--") for m in difflib.get_close_matches(x.split("=")[0], options, 1)]
    hint = f" (did you mean {' '.join(close)}?)" if close else ""
    parser.error(f"unrecognized arguments: {' '.join(stray)}{hint}")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail on the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _join_option_values(parser, sys.argv[1:] if argv is None else list(argv))
    args, extras = parser.parse_known_args(argv)
    # KEY=VALUE may come after options (argparse stops collecting positionals at the first option).
    stray = [x for x in extras if x.startswith("-") or "=" not in x or args.command != "train"]
    if stray:
        _unrecognized(parser.commands.get(args.command, parser), stray)
    if args.command is None:
        parser.print_help()
        return errors.USAGE
    try:
        if args.command == "train":
            return cmd_train(args, extras)
        if args.command == "profiles":
            return cmd_profiles(args)
        if args.command == "status":
            return cmd_status(args)
        from rocm_yolo.doctor.cli import run as run_doctor

        return run_doctor(args)
    except UsageError as e:
        print(f"rocm-yolo: error: {e}", file=sys.stderr)
        return errors.USAGE
    except errors.SetupError as e:
        print(f"rocm-yolo: environment error: {e}", file=sys.stderr)
        return errors.SETUP
    except KeyboardInterrupt:
        return errors.INTERRUPTED
    except BrokenPipeError:  # the reader of our output went away (rocm-yolo profiles | head -1): stop quietly
        _quiet_stdout()
        return errors.PIPE_CLOSED
    except Exception as e:  # a rocm-yolo bug: one line here, the traceback in a file
        found = triage.classify(e)
        if found.kind == triage.ENVIRONMENT:
            print(f"rocm-yolo: environment error: {found.line}", file=sys.stderr)
            return errors.SETUP
        return errors.report_internal(e)
