"""The doctor's vocabulary: a report :class:`Row`, the :class:`Options` the checks read, the
statuses, and what a training run with those options would load (:func:`loader_plan`).

Shared by :mod:`rocm_yolo.doctor` (command line and output), :mod:`rocm_yolo.doctor_checks`
and :mod:`rocm_yolo.doctor_data`, which import it and not one another's command line.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
SYMBOLS = {OK: "✓", WARN: "⚠", FAIL: "✗", SKIP: "–"}
_COLOURS = {OK: "\033[32m", WARN: "\033[33m", FAIL: "\033[31m", SKIP: "\033[2m"}

# Check groups, in the order they run; ``--skip`` takes these names.
CHECKS = ("versions", "gpu", "shm", "start", "data", "loader", "conv", "kernel")


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


@dataclass
class Options:
    """Everything the checks need: the parsed arguments plus the injectable system roots."""

    data: Path | None = None  # a dataset YAML, or a class-per-folder directory (classification)
    task: str | None = None  # what the data is checked for; None: what the data says (rocm_yolo.doctor_data.data_task)
    workers: int | None = None  # None: the profile's default
    batch: int = 16
    imgsz: int = 640
    profile: str = "fast"
    timeout: float = 120.0  # per subprocess step (DataLoader: from the moment the data set is built)
    skip: frozenset = frozenset()
    root: Path = Path("/")  # file-system root for /dev, /opt/rocm, /etc/group (fake trees in tests)
    rocm_path: Path | None = None
    kfd_root: str | None = None  # passed to rocm_yolo.rocm.detect_gpus
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
    from rocm_yolo.profiles import resolve

    cpus = opts.cpus or os.cpu_count() or 1
    resolved = resolve(opts.profile, opts.workers, cpu_count=cpus)
    s = resolved.loader
    val_workers = s.val_workers if s.val_workers is not None else min(2 * s.workers, cpus)
    return {"workers": s.workers, "val_workers": val_workers if s.workers else 0,
            "prefetch": s.prefetch_factor or 0, "warnings": list(resolved.warnings)}
