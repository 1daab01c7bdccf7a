"""Convolution self-test: which Conv2d strategy works on this GPU (``--conv auto``).

On gfx101x a MIOpen convolution may raise ("invalid device function"), return wrong
numbers, or abort the whole process (a GPU memory access fault ends in SIGABRT). So the
test runs in a throwaway subprocess (``python -m rocm_yolo.convtest --child ...``): it
runs a representative set of YOLO convolution shapes, forward and backward, with each
strategy on the device and compares outputs and gradients with a float64 CPU reference.
The first strategy that works and matches, in the order native, aten, fp32, gemm, wins.

If a strategy fails the child exits and a fresh child tests the next one (a failed HIP
launch can leave the device context unusable); if the child dies, the strategy it was
running is recorded as failed with the signal and the last line of its stderr. The whole
test never runs past its timeout: the child's process group is killed.

The choice is cached per (arch, torch version, HIP version, HSA_OVERRIDE_GFX_VERSION, amp)
in ``conv-selftest.json`` under the cache dir (``cache_dir`` argument,
``$ROCM_YOLO_CACHE_DIR``, or ``~/.cache/rocm-yolo``), written atomically.

This module does not import torch in the calling process: the supervisor may call it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rocm_yolo.fsutil import write_atomic
from rocm_yolo.proctree import kill_now, signal_name, start
from rocm_yolo.paths import cache_dir
from rocm_yolo.rocm import torch_build

__all__ = ["STRATEGIES", "SHAPES", "SelfTestError", "run_selftest", "resolve_strategy", "default_cache_dir"]

STRATEGIES = ("native", "aten", "fp32", "gemm")  # same order as rocm_yolo.patches.conv.STRATEGIES
CACHE_FILE = "conv-selftest.json"
_PREFIX = "ROCM_YOLO_SELFTEST "

#: (label, batch, in_channels, size, out_channels, kernel, stride, groups, bias): the
#: kinds of convolution a YOLO detection model runs (stem, downsampling, bottlenecks, 1x1
#: projections, depthwise convs of the head, the biased head outputs), kept small.
SHAPES = (
    ("stem 3x3/2", 2, 3, 64, 16, 3, 2, 1, False),
    ("down 3x3/2", 2, 16, 32, 32, 3, 2, 1, False),
    ("bottleneck 3x3", 2, 16, 32, 16, 3, 1, 1, False),
    ("pointwise 1x1", 2, 32, 16, 64, 1, 1, 1, False),
    ("depthwise 3x3", 2, 64, 16, 64, 3, 1, 64, False),
    ("head 3x3+bias", 2, 64, 8, 64, 3, 1, 1, True),
    ("head 1x1+bias", 2, 64, 8, 80, 1, 1, 1, True),
)

# Relative error allowed against the float64 reference (TF32/fp16 included).
_TOLERANCE = {"fp32": 5e-3, "amp": 3e-2}


class SelfTestError(RuntimeError):
    """No convolution strategy works (the message lists why each one failed)."""


# --------------------------------------------------------------------------- child side


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _check_strategy(strategy: str, device: str, amp: bool, references: dict) -> float:
    """Run every shape with ``strategy`` on ``device``; return the worst relative error."""
    import torch
    from torch import nn

    from rocm_yolo.patches.conv import PicklableConvForward

    forward = PicklableConvForward(strategy)
    device_type = torch.device(device).type
    amp_dtype = torch.bfloat16 if device_type == "cpu" else torch.float16
    worst = 0.0
    for shape in SHAPES:
        label, n, cin, size, cout, k, s, g, bias = shape
        if label not in references:
            torch.manual_seed(0)
            conv = nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=bias).double()
            x = torch.randn(n, cin, size, size, dtype=torch.float64, requires_grad=True)
            y = conv(x)
            grad = torch.randn_like(y)
            wanted = [x] + list(conv.parameters())
            references[label] = (conv, x.detach(), grad, [y.detach()] + list(torch.autograd.grad(y, wanted, grad)))
        conv_ref, x_ref, grad_ref, expected = references[label]
        conv = nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=bias).to(device)
        with torch.no_grad():
            conv.weight.copy_(conv_ref.weight)
            if bias:
                conv.bias.copy_(conv_ref.bias)
        x = x_ref.float().to(device).requires_grad_(True)
        with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
            y = forward(conv, x, conv.weight, conv.bias)
        got = [y] + list(torch.autograd.grad(y, [x] + list(conv.parameters()), grad_ref.to(device, y.dtype)))
        if device_type == "cuda":
            torch.cuda.synchronize()  # surface asynchronous kernel errors here, not later
        for name, a, b in zip(("output", "grad input", "grad weight", "grad bias"), got, expected):
            a = a.detach().double().cpu()
            if not torch.isfinite(a).all():
                raise RuntimeError(f"{label}: non-finite {name}")
            err = ((a - b).abs().max() / (b.abs().max() + 1e-6)).item()
            worst = max(worst, err)
            tol = _TOLERANCE["amp" if amp else "fp32"]
            if err > tol:
                raise RuntimeError(f"{label}: {name} differs from the CPU reference (rel err {err:.2e} > {tol:.0e})")
    return worst


def _child_main(device: str, strategies: list[str], amp: bool, stop_on_success: bool) -> int:
    """Report one JSON line per strategy; exit 3 after a failure so the parent starts afresh."""

    def emit(record: dict) -> None:
        sys.stdout.write(_PREFIX + json.dumps(record) + "\n")
        sys.stdout.flush()

    from rocm_yolo import faults

    references: dict = {}
    for strategy in strategies:
        emit({"start": strategy})
        try:
            faults.conv_fault(strategy)  # test hook: ROCM_YOLO_FAULT=conv-abort@native, ...
            err = _check_strategy(strategy, device, amp, references)
        except Exception as exc:  # noqa: BLE001 - every failure is a result
            emit({"strategy": strategy, "ok": False, "max_err": float("nan"), "error": _one_line(exc)})
            return 3
        emit({"strategy": strategy, "ok": True, "max_err": err, "error": None})
        if stop_on_success:
            return 0
    return 0


# --------------------------------------------------------------------------- parent side


def _stderr_tail(path: str) -> str:
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _run_child(device, strategies, amp, stop_on_success, budget):
    """One child run: (results, in-progress strategy or None, why the child ended badly or None)."""
    cmd = [sys.executable, "-m", "rocm_yolo.convtest", "--child", "--device", device,
           "--strategies", ",".join(strategies)]
    cmd += ["--amp"] if amp else []
    cmd += ["--stop-on-success"] if stop_on_success else []
    results: dict = {}
    current = None
    with tempfile.NamedTemporaryFile("w+", prefix="rocm-yolo-convtest-", suffix=".err", delete=False) as err:
        err_path = err.name
    try:
        with open(err_path, "w") as err_file:
            proc = start(cmd, stdout=subprocess.PIPE, stderr=err_file, stdin=subprocess.DEVNULL, text=True)
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + budget
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                kill_now(proc)
                return results, current, f"timed out after {budget:.0f}s (killed)"
            if line is None:
                break
            if not line.startswith(_PREFIX):
                continue
            record = json.loads(line[len(_PREFIX):])
            if "start" in record:
                current = record["start"]
            else:
                results[record.pop("strategy")] = record
                current = None
        code = proc.wait()
        if current is None and code in (0, 3):
            return results, None, None
        tail = _stderr_tail(err_path)
        how = f"process died ({signal_name(-code)})" if code < 0 else f"process exited with code {code}"
        return results, current, f"{how}: {tail}" if tail else how
    finally:
        os.unlink(err_path)


def run_selftest(device: str, strategies=STRATEGIES, timeout: float = 300.0, *, amp: bool = False,
                 stop_on_success: bool = False) -> dict:
    """Test ``strategies`` on ``device`` in subprocesses: {strategy: {"ok", "max_err", "error"}}.

    ``amp`` runs the convolutions under autocast (fp16 on GPUs), which is where ``fp32``
    differs from ``native``. With ``stop_on_success`` testing stops at the first strategy
    that passes (the later ones are absent from the result). Never runs past ``timeout``
    seconds in total; strategies not reached are reported as not run.
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown conv strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    deadline = time.monotonic() + timeout
    results: dict = {}
    remaining = list(strategies)
    while remaining:
        budget = deadline - time.monotonic()
        if budget <= 0:
            for s in remaining:
                results[s] = {"ok": False, "max_err": float("nan"), "error": f"not run: self-test budget of {timeout:.0f}s used up"}
            break
        got, current, failure = _run_child(device, remaining, amp, stop_on_success, budget)
        results.update(got)
        if current is not None:
            results[current] = {"ok": False, "max_err": float("nan"), "error": failure}
        elif failure is not None or not got:  # the child could not even start a strategy
            for s in remaining:
                results.setdefault(s, {"ok": False, "max_err": float("nan"),
                                       "error": f"self-test could not run: {failure or 'no output'}"})
        if stop_on_success and any(r["ok"] for r in results.values()):
            break
        remaining = [s for s in remaining if s not in results]
    return {s: results[s] for s in strategies if s in results}


# --------------------------------------------------------------------------- cache + resolve


def default_cache_dir() -> Path:
    """rocm-yolo's cache directory (:func:`rocm_yolo.paths.cache_dir`)."""
    return cache_dir()


def _load_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _pretty(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if home != "/" and text.startswith(home + os.sep) else text


def _failures(results: dict) -> str:
    return "; ".join(f"{s} failed: {r['error']}" for s, r in results.items() if not r["ok"])


def resolve_strategy(requested: str, arch: str | None, *, device: str = "cuda", cache_dir=None,
                     timeout: float = 300, amp: bool = False) -> tuple[str, str]:
    """Turn ``--conv`` into a strategy: (strategy, one-line explanation for the run header).

    An explicit strategy is returned as is. ``auto`` means ``native`` without ROCm (no AMD
    GPU, or a torch without HIP); on ROCm, the cached self-test result for this (arch,
    torch, HIP, HSA override, amp) or a fresh self-test. Raises SelfTestError when no
    strategy works, ValueError for an unknown name.
    """
    if requested != "auto":
        if requested not in STRATEGIES:
            raise ValueError(f"unknown conv strategy {requested!r}; choose auto or one of {', '.join(STRATEGIES)}")
        return requested, f"{requested} (requested)"
    build = torch_build()
    if arch is None:
        return "native", "native (auto: no AMD GPU detected)"
    if not build["hip"]:
        return "native", f"native (auto: torch {build['torch']} is not a ROCm build)"
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return _resolve_on_rocm(arch, build, path / CACHE_FILE, device=device, timeout=timeout, amp=amp)


def _resolve_on_rocm(arch: str, build: dict, path: Path, *, device: str, timeout: float, amp: bool) -> tuple[str, str]:
    """The ROCm half of ``resolve_strategy``: cache lookup, else self-test and cache write."""
    override = os.environ.get("HSA_OVERRIDE_GFX_VERSION", "")
    key = f"{arch}|torch {build['torch']}|hip {build['hip']}|hsa {override or '-'}|{'amp' if amp else 'fp32'}"
    entry = _load_cache(path).get(key)
    if isinstance(entry, dict) and entry.get("strategy") in STRATEGIES:
        why = _failures(entry.get("results", {}))
        return entry["strategy"], f"{entry['strategy']} (self-test, cached in {_pretty(path)}{': ' + why if why else ''})"
    results = run_selftest(device, STRATEGIES, timeout, amp=amp, stop_on_success=True)
    chosen = next((s for s, r in results.items() if r["ok"]), None)
    if chosen is None:
        raise SelfTestError(f"no convolution strategy works on {arch} ({device}): {_failures(results)}")
    cache = _load_cache(path)
    cache[key] = {"strategy": chosen, "results": results, "tested_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=2, sort_keys=True))
        where = f"saved to {_pretty(path)}"
    except OSError as exc:
        where = f"not cached: {exc}"
    why = _failures(results)
    return chosen, f"{chosen} (self-test: {why + '; ' if why else 'passed; '}{where})"


# --------------------------------------------------------------------------- entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocm_yolo.convtest",
                                     description="Test which Conv2d strategy works on this GPU.")
    parser.add_argument("--device", default="cuda", help="torch device to test (default: cuda)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, in order")
    parser.add_argument("--amp", action="store_true", help="run the convolutions under autocast")
    parser.add_argument("--stop-on-success", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    if args.child:
        return _child_main(args.device, strategies, args.amp, args.stop_on_success)
    results = run_selftest(args.device, strategies, args.timeout, amp=args.amp, stop_on_success=args.stop_on_success)
    for strategy, r in results.items():
        status = f"ok   max rel err {r['max_err']:.1e}" if r["ok"] else f"FAIL {r['error']}"
        print(f"{strategy:<7} {status}")
    return 0 if any(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
