"""Convolution self-test: which Conv2d strategies work on this GPU, and which is fastest (``--conv auto``).

On gfx101x a MIOpen convolution may raise ("invalid device function"), return wrong
numbers, or abort the whole process (a GPU memory access fault ends in SIGABRT), and some
fail only in validation (half precision, new shapes: ROCm/MIOpen#3077). So the test runs
in a throwaway subprocess (``python -m rocm_yolo.conv.selftest --child ...``) that, for every
strategy of :data:`STRATEGIES`, checks a training step and YOLO's validation against a
float64 CPU reference and times a training step at YOLO scale
(:mod:`rocm_yolo.conv.probe` says exactly what runs). ``auto`` then takes the fastest
strategy that passed (:func:`choose`); timings within :data:`TIE_MARGIN` of each other go
to the earlier strategy of the list (the least intrusive: ``miopen-off``, which changes
BatchNorm too, comes last).

If a strategy fails the child exits and a fresh child tests the next one (a failed HIP
launch can leave the device context unusable); if the child dies, the strategy it was
running is recorded as failed with the signal and the last line of its stderr. The whole
test never runs past its timeout: the child's process group is killed.

The choice and every strategy's result and time are cached per (arch, torch version, HIP
version, HSA_OVERRIDE_GFX_VERSION, amp) in ``conv-selftest.json`` under the cache dir
(``cache_dir`` argument, ``$ROCM_YOLO_CACHE_DIR``, or ``~/.cache/rocm-yolo``), written
atomically.

This module does not import torch in the calling process: the supervisor may call it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from rocm_yolo.conv.strategies import AUTO, STRATEGIES
from rocm_yolo.environment import cache_dir, cache_problem
from rocm_yolo.errors import one_line
from rocm_yolo.gpu.torch_build import torch_build
from rocm_yolo.process.lifecycle import signal_name
from rocm_yolo.process.tree import python, run_bounded
from rocm_yolo.run import hooks
from rocm_yolo.run.atomic import write_atomic

__all__ = [
    "STRATEGIES",
    "Timing",
    "SelfTestError",
    "run_selftest",
    "choose",
    "timings_text",
    "resolve_strategy",
    "default_cache_dir",
    "default_timing",
]

CACHE_FILE = "conv-selftest.json"
CACHE_VERSION = 2  # entries of version 1 were chosen by order, without timings: tested again
DEFAULT_TIMEOUT = 600.0  # five strategies; the first MIOpen use can compile kernels for minutes
TIE_MARGIN = 0.10  # timings this close (relative) are noise: the earlier strategy wins
_PREFIX = "ROCM_YOLO_SELFTEST "


@dataclass(frozen=True)
class Timing:
    """The timed run's size: a training step of the probe blocks at ``imgsz`` x ``batch``,
    repeated for up to ``budget_s`` seconds (at least three steps, at most ten)."""

    imgsz: int
    batch: int
    budget_s: float


def default_timing(device: str) -> Timing:
    """640 px, batch 8 on a GPU (YOLO's scale); tiny on the CPU, where the test exists for tests and by-hand checks."""
    return Timing(32, 1, 0.0) if device == "cpu" else Timing(640, 8, 2.0)


class SelfTestError(RuntimeError):
    """No convolution strategy works (the message lists why each one failed)."""


# --------------------------------------------------------------------------- child side


def _child_main(device: str, strategies: list[str], amp: bool, timing: Timing) -> int:
    """Report one JSON line per strategy; exit 3 after a failure so the parent starts afresh."""

    def emit(record: dict) -> None:
        sys.stdout.write(_PREFIX + json.dumps(record) + "\n")
        sys.stdout.flush()

    probe = reference = None
    for strategy in strategies:
        emit({"start": strategy})
        try:
            hooks.conv_fault(strategy)  # tests: ROCM_YOLO_FAULT=conv-abort@native, ... (before torch: quick)
            if probe is None:  # torch's own kernels, before any strategy is installed here
                from rocm_yolo.conv import probe  # imports torch

                reference = probe.build_reference(device)
            probe.prepare(strategy)
            err = max(probe.check_training(reference, device, amp), probe.check_validation(reference, device, amp))
            probe.check_validation_at_scale(device, amp, timing.imgsz, timing.batch)
            seconds = probe.time_training(device, amp, timing.imgsz, timing.batch, budget_s=timing.budget_s)
        except Exception as exc:  # noqa: BLE001 - every failure is a result
            plain = probe is not None and isinstance(exc, probe.ProbeError)  # a ProbeError says where and what
            emit(
                {
                    "strategy": strategy,
                    "ok": False,
                    "max_err": float("nan"),
                    "error": one_line(exc, typed=not plain),
                    "time_s": None,
                }
            )
            return 3
        emit({"strategy": strategy, "ok": True, "max_err": err, "error": None, "time_s": seconds})
    return 0


# --------------------------------------------------------------------------- parent side


def _run_child(device, strategies, amp, timing: Timing, budget, env):
    """One child run: (results, in-progress strategy or None, why the child ended badly or None)."""
    cmd = [
        *python("-m", "rocm_yolo.conv.selftest"),
        "--child",
        "--device",
        device,
        "--strategies",
        ",".join(strategies),
        "--time-imgsz",
        str(timing.imgsz),
        "--time-batch",
        str(timing.batch),
        "--time-budget",
        str(timing.budget_s),
    ]
    cmd += ["--amp"] if amp else []
    outcome = run_bounded(cmd, budget, None if env is None else dict(env))
    results: dict = {}
    current = None
    for line in outcome.stdout.splitlines():
        if not line.startswith(_PREFIX):
            continue
        try:
            record = json.loads(line[len(_PREFIX) :])
        except ValueError:  # a line cut short by the kill
            continue
        if "start" in record:
            current = record["start"]
        else:
            results[record.pop("strategy")] = record
            current = None
    if outcome.timed_out:
        return results, current, f"timed out after {budget:.0f}s (killed)"
    code = outcome.returncode
    if current is None and code in (0, 3):
        return results, None, None
    tail = (outcome.tail(1) or [""])[0].strip()[:300]
    how = f"process died ({signal_name(-code)})" if code < 0 else f"process exited with code {code}"
    return results, current, f"{how}: {tail}" if tail else how


def _failed(error: str) -> dict:
    return {"ok": False, "max_err": float("nan"), "error": error, "time_s": None}


def run_selftest(
    device: str,
    strategies=STRATEGIES,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    amp: bool = False,
    timing: Timing | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """Test and time ``strategies`` on ``device`` in subprocesses.

    Returns {strategy: {"ok", "max_err", "error", "time_s"}} in the order given; ``time_s``
    is the median seconds of a training step (None for a strategy that failed). ``amp`` runs
    the training step under autocast (fp16 on GPUs), which is where ``fp32`` differs from
    ``native``; the validation check always includes half precision. ``timing`` defaults to
    :func:`default_timing`; ``env`` is the children's environment (default: this process's).
    Never runs past ``timeout`` seconds in total; strategies not reached are reported as not run.
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown conv strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    timing = timing or default_timing(device)
    deadline = time.monotonic() + timeout
    results: dict = {}
    remaining = list(strategies)
    while remaining:
        budget = deadline - time.monotonic()
        if budget <= 0:
            for s in remaining:
                results[s] = _failed(f"not run: self-test budget of {timeout:.0f}s used up")
            break
        got, current, failure = _run_child(device, remaining, amp, timing, budget, env)
        results.update(got)
        if current is not None:
            results[current] = _failed(failure)
        elif failure is not None or not got:  # the child could not even start a strategy
            for s in remaining:
                results.setdefault(s, _failed(f"self-test could not run: {failure or 'no output'}"))
        remaining = [s for s in remaining if s not in results]
    return {s: results[s] for s in strategies if s in results}


def choose(results: Mapping[str, dict], margin: float = TIE_MARGIN) -> str | None:
    """The fastest strategy that passed; within ``margin`` of the fastest, the earliest of :data:`STRATEGIES`.

    None when none passed.
    """
    timed = {s: r["time_s"] for s, r in results.items() if r.get("ok") and r.get("time_s") is not None}
    if not timed:
        return None
    fastest = min(timed.values())
    return next(s for s in STRATEGIES if s in timed and timed[s] <= fastest * (1 + margin))


def timings_text(results: Mapping[str, dict], chosen: str) -> str:
    """``"gemm 1.0, aten 3.1x, fp32 3.2x"``: each passing strategy's step time relative to ``chosen``."""
    base = results[chosen]["time_s"]
    others = sorted(
        (r["time_s"], s) for s, r in results.items() if s != chosen and r.get("ok") and r.get("time_s") is not None
    )
    return ", ".join([f"{chosen} 1.0"] + [f"{s} {t / base:.1f}x" for t, s in others])


# --------------------------------------------------------------------------- cache + resolve


def default_cache_dir() -> Path:
    """rocm-yolo's cache directory (:func:`rocm_yolo.environment.cache_dir`)."""
    return cache_dir()


def _load_cache(path: Path) -> dict:
    if cache_problem(path) is not None:  # another user's choice (or a link to one) is no cache of the user's
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _pretty(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if home != "/" and text.startswith(home + os.sep) else text


def _failures(results: dict) -> str:
    return "; ".join(f"{s} failed: {r['error']}" for s, r in results.items() if not r["ok"])


def cache_key(arch: str, build: dict, amp: bool, env: Mapping[str, str] = os.environ) -> str:
    """The self-test cache key: what decides which strategies work and how fast."""
    override = env.get("HSA_OVERRIDE_GFX_VERSION", "")
    return f"{arch}|torch {build['torch']}|hip {build['hip']}|hsa {override or '-'}|{'amp' if amp else 'fp32'}"


def cached_entry(path: Path, key: str) -> dict | None:
    """The valid cache entry for ``key`` in ``path``, or None (missing, corrupt, or of an older version)."""
    entry = _load_cache(path).get(key)
    if (
        isinstance(entry, dict)
        and entry.get("version") == CACHE_VERSION
        and entry.get("strategy") in STRATEGIES
        and isinstance(entry.get("results"), dict)
        and entry["strategy"] in entry["results"]
    ):
        return entry
    return None


def resolve_strategy(
    requested: str,
    arch: str | None,
    *,
    device: str = "cuda",
    cache_dir=None,
    timeout: float = DEFAULT_TIMEOUT,
    amp: bool = False,
) -> tuple[str, str]:
    """Turn ``--conv`` into a strategy: (strategy, one-line explanation for the run header).

    An explicit strategy is returned as is. ``auto`` means ``native`` without ROCm (no AMD
    GPU, or a torch without HIP); on ROCm, the cached self-test result for this (arch,
    torch, HIP, HSA override, amp) or a fresh self-test, which picks the fastest strategy
    that passes. Raises SelfTestError when no strategy works, ValueError for an unknown name.
    """
    if requested != AUTO:
        if requested not in STRATEGIES:
            raise ValueError(f"unknown conv strategy {requested!r}; choose {AUTO} or one of {', '.join(STRATEGIES)}")
        return requested, f"{requested} (requested)"
    build = torch_build()
    if arch is None:
        return "native", "native (auto: no AMD GPU detected)"
    if not build["hip"]:
        return "native", f"native (auto: torch {build['torch']} is not a ROCm build)"
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return _resolve_on_rocm(arch, build, path / CACHE_FILE, device=device, timeout=timeout, amp=amp)


def _resolve_on_rocm(
    arch: str, build: dict, path: Path, *, device: str, timeout: float, amp: bool, timing: Timing | None = None
) -> tuple[str, str]:
    """The ROCm half of ``resolve_strategy``: cache lookup, else self-test and cache write."""
    key = cache_key(arch, build, amp)
    entry = cached_entry(path, key)
    if entry is not None:
        results, chosen = entry["results"], entry["strategy"]
        why = _failures(results)
        return chosen, (
            f"{chosen} (auto, cached in {_pretty(path)}; {why + '; ' if why else ''}{timings_text(results, chosen)})"
        )
    timing = timing or default_timing(device)
    results = run_selftest(device, STRATEGIES, timeout, amp=amp, timing=timing)
    chosen = choose(results)
    if chosen is None:
        raise SelfTestError(f"no convolution strategy works on {arch} ({device}): {_failures(results)}")
    cache = _load_cache(path)
    cache[key] = {
        "version": CACHE_VERSION,
        "strategy": chosen,
        "results": results,
        "timing": {"imgsz": timing.imgsz, "batch": timing.batch, "amp": amp},
        "tested_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        problem = cache_problem(path)
        if problem is not None:
            raise OSError(f"{problem}, not the user's own")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=2, sort_keys=True))
        where = f"saved to {_pretty(path)}"
    except OSError as exc:
        where = f"not cached: {exc}"
    why = _failures(results)
    return chosen, f"{chosen} (auto; {why + '; ' if why else ''}{timings_text(results, chosen)}; {where})"


# --------------------------------------------------------------------------- entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rocm_yolo.conv.selftest", description="Test and time the Conv2d strategies on this GPU."
    )
    parser.add_argument("--device", default="cuda", help="torch device to test (default: cuda)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    parser.add_argument("--amp", action="store_true", help="run the training step under autocast")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument("--time-imgsz", type=int, help="image size of the timed run (default: 640 on a GPU)")
    parser.add_argument("--time-batch", type=int, help="batch of the timed run (default: 8 on a GPU)")
    parser.add_argument("--time-budget", type=float, help="seconds to time each strategy for (default: 2 on a GPU)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    base = default_timing(args.device)
    timing = Timing(
        args.time_imgsz or base.imgsz,
        args.time_batch or base.batch,
        base.budget_s if args.time_budget is None else args.time_budget,
    )
    if args.child:
        return _child_main(args.device, strategies, args.amp, timing)
    results = run_selftest(args.device, strategies, args.timeout, amp=args.amp, timing=timing)
    chosen = choose(results)
    for strategy, r in results.items():
        status = (
            f"ok   {r['time_s'] * 1e3:8.1f} ms/step  max rel err {r['max_err']:.1e}"
            if r["ok"]
            else f"FAIL {r['error']}"
        )
        print(f"{strategy:<10} {status}")
    if chosen is None:
        print("auto: no strategy works")
        return 1
    print(f"auto: {chosen} ({timings_text(results, chosen)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
