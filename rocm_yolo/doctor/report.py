"""The doctor's vocabulary and its report: a :class:`Row`, the statuses and exit codes, and the verdict and output
(a table for people, JSON for scripts).

The checks (:mod:`.system`, :mod:`.gpu_checks`, :mod:`.data_checks`, :mod:`.loader_probe`) import this module and
the options they read (:mod:`.options`), not one another's command line (:mod:`.cli`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
SYMBOLS = {OK: "✓", WARN: "⚠", FAIL: "✗", SKIP: "–"}
_COLOURS = {OK: "\033[32m", WARN: "\033[33m", FAIL: "\033[31m", SKIP: "\033[2m"}


@dataclass
class Row:
    """One line of the report."""

    check: str  # stable id for scripts, e.g. "gpu.override"
    name: str  # short label for people
    status: str  # OK, WARN, FAIL or SKIP
    found: str  # what was found, one line
    fix: str | None = None  # what to do, in words a user can act on
    details: list[str] = field(default_factory=list)  # extra lines (file names, log lines)
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable facts for --json


# ---------------------------------------------------------------------------------------
# verdicts and output


def plural(count: int, word: str) -> str:
    """``3 batches``, ``1 class``, ``2 classes``."""
    return f"{count} {word}{'' if count == 1 else 'es' if word.endswith(('ch', 'ss')) else 's'}"


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
    return _plain(
        {
            "version": 1,
            "ok": code == EXIT_OK,
            "exit_code": code,
            "conclusion": verdict,
            "counts": {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL, SKIP)},
            "rows": [asdict(r) for r in rows],
        }
    )


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
