"""Settings profiles, and the one place where loader settings are validated.

A profile is a frozen, named set of DataLoader and training settings that users validated
on their hardware: ``fast`` (persistent workers from a preloaded fork server), ``safe``
(half the workers, fresh every epoch, no validation during training), ``threads`` (no
worker process: the loaders run in a pool of threads inside the trainer, see
:mod:`rocm_yolo.patches.loaders.threads`) and ``single`` (no worker process and no loader thread at
all, the guaranteed fallback). Flags and KEY=VALUE overrides are merged onto a profile by
:func:`resolve`, which is the only function that decides whether a combination is valid.

The record they give, :class:`~rocm_yolo.run.spec.LoaderSettings`, travels in the run's spec; this module is
imported by the CLI: it must not import torch or ultralytics.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from rocm_yolo.errors import UsageError, option
from rocm_yolo.run.spec import LoaderSettings


@dataclass(frozen=True)
class Profile:
    """One validated settings profile (the values before the user's overrides)."""

    name: str
    summary: str
    default_workers: int  # workers when --workers is not given
    max_workers: int | None  # hard cap on train workers (None: as requested)
    val_workers_cap: int | None  # cap on the validation loader (None: Ultralytics' 2 x workers; -1: the train workers)
    persistent_workers: bool
    prefetch_factor: int
    pin_memory: bool | None  # None: Ultralytics decides (on when a GPU is present)
    timeout: float  # DataLoader timeout in seconds, 0 = wait forever (the watchdog still watches)
    val: bool  # validation after every epoch (the final validation always runs)
    env: tuple[tuple[str, str], ...] = ()
    threads: int = 0  # loader threads in the trainer process (0: none); capped at the CPU count
    worker_divisor: int = 1  # train workers = ceil(requested / divisor): fewer workers against contention

    def workers_for(self, requested: int) -> int:
        n = -(-requested // self.worker_divisor)
        return n if self.max_workers is None else min(n, self.max_workers)

    def rows(self) -> list[tuple[str, str]]:
        """Every setting as (name, value) text, for ``rocm-yolo profiles``."""
        workers = f"as requested (default {self.default_workers})"
        if self.worker_divisor > 1:
            workers = f"half the requested (default {self.workers_for(self.default_workers)})"
        if self.max_workers is not None:
            workers = "0 (no worker process)" if self.max_workers == 0 else f"min(requested, {self.max_workers})"
        val_workers = "2 x workers (Ultralytics)" if self.val_workers_cap is None else f"<= {self.val_workers_cap}"
        if self.val_workers_cap == -1:
            val_workers = "<= workers"
        single = self.max_workers == 0
        loading = single and not self.threads  # nothing runs beside the main thread: no loader setting applies
        return [
            ("workers", workers),
            ("val workers", "0" if single else val_workers),
            ("loader threads", f"min({self.threads}, CPUs)" if self.threads else "-"),
            ("start method", "-" if single else "forkserver (preloaded)"),
            ("persistent", "-" if single else str(self.persistent_workers).lower()),
            (
                "prefetch_factor",
                "-" if loading else str(self.prefetch_factor) + (" per thread" if self.threads else ""),
            ),
            ("pin_memory", "auto (on with a GPU)" if self.pin_memory is None else str(self.pin_memory).lower()),
            ("timeout", "-" if loading else (f"{self.timeout:g} s" if self.timeout else "none (watchdog)")),
            ("val", "every epoch" if self.val else "final only"),
            ("env", " ".join(f"{k}={v}" for k, v in self.env) or "-"),
        ]


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="fast",
            summary="persistent workers from a preloaded fork server, validation every epoch",
            default_workers=4,
            max_workers=None,
            val_workers_cap=None,
            persistent_workers=True,
            prefetch_factor=4,
            pin_memory=None,
            timeout=0,
            val=True,
        ),
        Profile(
            name="safe",
            summary="half the workers, fresh every epoch, no validation during training",
            default_workers=4,
            max_workers=None,
            val_workers_cap=-1,  # no more than the train workers
            persistent_workers=False,
            prefetch_factor=2,
            pin_memory=False,
            timeout=300,
            val=False,
            env=(("OMP_NUM_THREADS", "2"),),
            worker_divisor=2,
        ),
        Profile(
            name="threads",
            summary="no worker process: loading in threads of the trainer (threads=N), validation every epoch",
            default_workers=0,
            max_workers=0,
            val_workers_cap=None,
            persistent_workers=False,
            prefetch_factor=2,
            pin_memory=None,
            timeout=0,
            val=True,
            threads=8,
        ),
        Profile(
            name="single",
            summary="no worker process at all: the guaranteed fallback",
            default_workers=0,
            max_workers=0,
            val_workers_cap=0,
            persistent_workers=False,
            prefetch_factor=2,
            pin_memory=False,
            timeout=0,
            val=True,
        ),
    )
}
# Every profile, from the fastest to the safest (PROFILES' order): the order a fallback steps down in, and the
# fallback ladder's default (WatchdogConfig.ladder, --fallback). The default profile is --profile's (TrainRequest).
DEFAULT_LADDER = tuple(PROFILES)

START_METHODS = ("forkserver", "spawn", "fork")


@dataclass(frozen=True)
class Resolved:
    profile: Profile
    loader: LoaderSettings
    val: bool
    env: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    requested_workers: int = 0  # what was asked for, before the profile's cap or divisor


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown profile '{name}': choose one of {', '.join(PROFILES)}") from None


def parse_int(key: str, value: object, *, minimum: int = 0) -> int:
    """An integer setting from a flag or KEY=VALUE; bools and floats with a fraction are rejected."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise UsageError(f"{key}={value!r} is not an integer: use e.g. {key}=2")
    try:
        n = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"{key}={value!r} is not an integer: use e.g. {key}=2") from None
    if n < minimum:
        raise UsageError(f"{key}={n} must be >= {minimum}")
    return n


def parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise UsageError(f"{key}={value!r} is not a boolean: use {key}=true or {key}=false")


def parse_seconds(key: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"{key}={value!r} is not a number of seconds") from None
    if not math.isfinite(seconds):
        raise UsageError(f"{key}={value!r} is not a finite number of seconds (0 waits forever)")
    if seconds < 0:
        raise UsageError(f"{key}={seconds:g} must be >= 0 (0 waits forever)")
    return seconds


def parse_start_method(key: str, value: object) -> str:
    method = str(value)
    if method not in START_METHODS:
        raise UsageError(f"{key}={method!r}: choose one of {', '.join(START_METHODS)}")
    return method


def _at_least(minimum: int) -> Callable[[str, object], int]:
    return lambda key, value: parse_int(key, value, minimum=minimum)


@dataclass(frozen=True)
class _Loading:
    """What a combination is checked against: the profile, and the workers and threads it ends up with."""

    profile: Profile
    workers: int
    threads: int


@dataclass(frozen=True)
class LoaderKey:
    """How one loader KEY=VALUE is read (``parse``) and when the merged result refuses it (``refuse``)."""

    parse: Callable[[str, object], object]
    refuse: Callable[[object, _Loading], str | None] = lambda value, loading: None


# KEY=VALUE names that set DataLoader settings (torch's names) rather than Ultralytics train args.
LOADER_SETTINGS: dict[str, LoaderKey] = {
    "persistent_workers": LoaderKey(
        parse_bool,
        lambda on, at: (
            f"persistent_workers=true needs workers > 0: drop it or set {option('workers')}"
            if on and not at.workers
            else None
        ),
    ),
    "prefetch_factor": LoaderKey(
        _at_least(1),
        lambda _, at: (
            f"prefetch_factor needs workers > 0: drop it or set {option('workers')}"
            if not at.workers and not at.threads
            else None
        ),
    ),
    "pin_memory": LoaderKey(parse_bool),
    "timeout": LoaderKey(parse_seconds),
    "val_workers": LoaderKey(_at_least(0)),
    "start_method": LoaderKey(parse_start_method),
    "threads": LoaderKey(_at_least(1)),  # only with a profile that has loader threads: checked before it is read
}
LOADER_KEYS = frozenset(LOADER_SETTINGS)


def _workers(profile: Profile, workers: object | None, cpus: int, warnings: list[str]) -> tuple[int, int]:
    """(what was asked for, the train workers the profile and the CPU count make of it)."""
    requested = profile.default_workers if workers is None else parse_int("workers", workers)
    n = profile.workers_for(requested)
    if n != requested and workers is not None:
        if profile.max_workers == 0:
            hint = " (set its loader threads with threads=N)" if profile.threads else ""
            warnings.append(
                f"profile '{profile.name}' runs without worker processes: workers={requested} ignored{hint}"
            )
        else:
            warnings.append(
                f"profile '{profile.name}' uses {'half the' if profile.worker_divisor > 1 else 'at most'} "
                f"workers: workers={requested} -> {n}"
            )
    if n > cpus:
        if workers is not None:  # the profile's default is capped without a word: the user set nothing
            warnings.append(f"workers={n} is more than the {cpus} CPUs here: capped at {cpus}")
        n = cpus
    return requested, n


def _threads(profile: Profile, given: Mapping[str, object], cpus: int, warnings: list[str]) -> int:
    if "threads" not in given:
        return min(profile.threads, cpus)
    threads = int(given["threads"])  # type: ignore[arg-type]
    if threads > cpus:
        warnings.append(f"threads={threads} is more than the {cpus} CPUs here: capped at {cpus}")
        threads = cpus
    return threads


def _loader(profile: Profile, given: Mapping[str, object], workers: int, threads: int, cpus: int) -> LoaderSettings:
    persistent = given.get("persistent_workers", profile.persistent_workers)
    prefetch = given.get("prefetch_factor", profile.prefetch_factor)
    if workers == 0:  # torch rejects these with num_workers=0 (loader threads keep their prefetch)
        persistent, prefetch = False, (prefetch if threads else None)
    val_workers = given.get("val_workers", workers if profile.val_workers_cap == -1 else profile.val_workers_cap)
    if val_workers is not None:
        val_workers = min(val_workers, cpus) if workers or threads else 0
    return LoaderSettings(
        workers=workers,
        val_workers=val_workers,
        persistent_workers=persistent,
        prefetch_factor=prefetch,
        pin_memory=given.get("pin_memory", profile.pin_memory),
        timeout=given.get("timeout", profile.timeout),
        start_method=given.get("start_method", LoaderSettings.start_method),
        threads=threads,
    )


def resolve(
    profile_name: str,
    workers: object | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    val: object | None = None,
    cpu_count: int | None = None,
) -> Resolved:
    """Merge a profile, the --workers flag and loader KEY=VALUE overrides, and validate the result.

    ``overrides`` holds only keys from :data:`LOADER_SETTINGS`, each read and checked as that
    table says. Raises :class:`UsageError` with a one-line message; returns warnings (e.g.
    workers capped at the CPU count) for the log.
    """
    profile = get_profile(profile_name)
    overrides = dict(overrides or {})
    unknown = set(overrides) - LOADER_KEYS
    if unknown:
        raise UsageError(f"not a loader setting: {', '.join(sorted(unknown))}")
    if "threads" in overrides and not profile.threads:
        raise UsageError(
            f"threads= sets the loader threads of {option('profile', 'threads')}, not of '{profile.name}': "
            f"add {option('profile', 'threads')} or drop threads="
        )
    given = {key: LOADER_SETTINGS[key].parse(key, value) for key, value in overrides.items()}
    warnings: list[str] = []
    cpus = cpu_count or os.cpu_count() or 1
    requested, n = _workers(profile, workers, cpus, warnings)
    threads = _threads(profile, given, cpus, warnings)
    loading = _Loading(profile, n, threads)
    for key, value in given.items():
        message = LOADER_SETTINGS[key].refuse(value, loading)
        if message:
            raise UsageError(message)
    if given.get("start_method") == "fork":
        warnings.append("start_method=fork: DataLoader workers inherit GPU runtime state and may hang")
    loader = _loader(profile, given, n, threads, cpus)
    do_val = profile.val if val is None else parse_bool("val", val)
    return Resolved(
        profile=profile,
        loader=loader,
        val=do_val,
        env=dict(profile.env),
        warnings=tuple(warnings),
        requested_workers=requested,
    )


def next_profile(current: str, ladder: tuple[str, ...]) -> str:
    """The profile after ``current`` on the fallback ladder (the last one repeats).

    A profile that is not on the ladder steps down to the first rung that is safer than it in
    the default order (``--profile threads --fallback fast,safe,single`` goes on to ``single``,
    never back to worker processes)."""
    if current in ladder:
        i = ladder.index(current)
        return ladder[min(i + 1, len(ladder) - 1)]
    if current in DEFAULT_LADDER:
        rank = DEFAULT_LADDER.index(current)
        safer = [p for p in ladder if p in DEFAULT_LADDER and DEFAULT_LADDER.index(p) > rank]
        return safer[0] if safer else current  # nothing safer on it: stay (as its last rung would)
    return ladder[0]


def parse_ladder(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise UsageError(
            f"{option('fallback')} needs at least one profile, e.g. {option('fallback', 'fast,safe,threads,single')}"
        )
    for name in names:
        get_profile(name)
    return names


__all__ = [
    "DEFAULT_LADDER",
    "LOADER_KEYS",
    "LOADER_SETTINGS",
    "PROFILES",
    "Profile",
    "Resolved",
    "get_profile",
    "next_profile",
    "parse_ladder",
    "resolve",
]
