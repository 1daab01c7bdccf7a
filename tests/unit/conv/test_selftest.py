"""The conv self-test: real children on the CPU, made to misbehave; its choice, its cache, and the doctor's row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocm_yolo.conv import selftest as convtest
from rocm_yolo.gpu.arch import GpuNode
from rocm_yolo.gpu.torch_build import torch_build
from rocm_yolo.testing import faults

FAKE_ROCM = {"torch": "2.14.1+rocm6.4", "hip": "6.4.1", "cuda": None}


def _resolve(cache: Path):
    return convtest._resolve_on_rocm(
        "gfx1010", FAKE_ROCM, cache / convtest.CACHE_FILE, device="cpu", timeout=120, amp=False
    )


def _ok(seconds):
    return {"ok": True, "max_err": 1e-6, "error": None, "time_s": seconds}


def _bad(error):
    return {"ok": False, "max_err": float("nan"), "error": error, "time_s": None}


def test_choose_takes_the_fastest_and_breaks_near_ties_by_order():
    assert convtest.choose({"native": _ok(0.30), "aten": _ok(0.10), "gemm": _ok(0.35)}) == "aten"
    # within 10% of the fastest, the earlier (less intrusive) strategy wins
    assert convtest.choose({"native": _ok(0.105), "aten": _ok(0.10), "miopen-off": _ok(0.099)}) == "native"
    assert convtest.choose({"aten": _ok(0.50), "miopen-off": _ok(0.30)}) == "miopen-off"
    assert convtest.choose({"native": _bad("HIP error"), "gemm": _ok(0.4)}) == "gemm"
    assert convtest.choose({"native": _bad("HIP error")}) is None
    results = {"native": _bad("x"), "aten": _ok(0.31), "fp32": _ok(0.32), "gemm": _ok(0.1)}
    assert convtest.timings_text(results, "gemm") == "gemm 1.0, aten 3.1x, fp32 3.2x"


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    """One real self-test on the CPU through ``auto``, with two strategies made to misbehave:
    native fails in fp16 inference only (as in ROCm/MIOpen#3077, a YOLOv8 run that trained,
    then crashed in validation); aten, first of the rest in order, is made really slower
    (conv-slow spins in each of its convolutions)."""
    cache = tmp_path_factory.mktemp("conv-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROCM_YOLO_PLUGINS", "rocm_yolo.testing")
        mp.setenv("ROCM_YOLO_FAULT", "conv-half-inference@native,conv-slow@aten")
        strategy, why = _resolve(cache)
    (entry,) = json.loads((cache / convtest.CACHE_FILE).read_text()).values()
    return strategy, why, entry, cache


def test_strategy_failing_only_in_fp16_inference_is_passed_over(auto_run):
    strategy, why, entry, _ = auto_run
    native = entry["results"]["native"]
    assert not native["ok"] and native["time_s"] is None and strategy != "native"
    assert native["error"].startswith("validation, EMA fp16")  # the training step before it passed
    assert "No invoker was registered" in native["error"]
    assert f"native failed: {native['error']}" in why


def test_auto_takes_the_fastest_by_measured_time_and_caches_the_timings(auto_run, monkeypatch):
    from rocm_yolo.conv.probe import LAYERS

    strategy, why, entry, cache = auto_run
    results = entry["results"]
    assert set(results) == set(convtest.STRATEGIES)
    for name in ("aten", "fp32", "gemm", "miopen-off"):  # all pass, all timed
        r = results[name]
        assert r["ok"] and r["error"] is None and r["max_err"] < 5e-2 and r["time_s"] > 0, (name, r)
    # aten spun SLOW_CONV_SECONDS of CPU time in each convolution of each step: measured, and passed over
    assert results["aten"]["time_s"] >= faults.SLOW_CONV_SECONDS * len(LAYERS)
    assert strategy not in ("native", "aten") and strategy == entry["strategy"] == convtest.choose(results)
    assert why.startswith(f"{strategy} (auto; native failed: validation") and "saved to" in why
    assert f"; {convtest.timings_text(results, strategy)}; " in why  # e.g. "gemm 1.0, ..., aten 3.1x"
    assert float(why.split(" aten ")[1].split("x")[0]) > 1
    assert entry["timing"] == {"imgsz": 32, "batch": 1, "amp": False}

    monkeypatch.setenv("ROCM_YOLO_PLUGINS", "rocm_yolo.testing")

    monkeypatch.setenv("ROCM_YOLO_FAULT", ",".join(f"conv-hang@{s}" for s in convtest.STRATEGIES))
    again, why = _resolve(cache)  # answered from the cache: nothing runs (or hangs)
    assert again == strategy and "cached in" in why and convtest.timings_text(results, strategy) in why


def test_selftest_survives_raise_abort_and_hang(monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_PLUGINS", "rocm_yolo.testing")
    monkeypatch.setenv("ROCM_YOLO_FAULT", "conv-abort@native,conv-raise@aten,conv-hang@fp32")
    results = convtest.run_selftest("cpu", timeout=5)  # the failing children never import torch: quick
    assert not results["native"]["ok"] and "SIGABRT" in results["native"]["error"]
    assert "Memory access fault" in results["native"]["error"]
    assert "invalid device function" in results["aten"]["error"]
    assert "timed out" in results["fp32"]["error"]
    assert "not run" in results["gemm"]["error"] and "not run" in results["miopen-off"]["error"]
    assert convtest.choose(results) is None


def test_explicit_and_non_rocm_requests():
    assert convtest.resolve_strategy("gemm", "gfx1010") == ("gemm", "gemm (requested)")
    assert convtest.resolve_strategy("miopen-off", "gfx1010")[0] == "miopen-off"
    assert convtest.resolve_strategy("auto", None)[0] == "native"
    if torch_build()["hip"] is None:  # this machine's torch is not a ROCm build
        strategy, why = convtest.resolve_strategy("auto", "gfx1010")
        assert strategy == "native" and "not a ROCm build" in why
    with pytest.raises(ValueError, match="auto or one of"):
        convtest.resolve_strategy("fastest", "gfx1010")


def test_cache_key_and_entries(tmp_path):
    key = convtest.cache_key("gfx1010", FAKE_ROCM, False, {})
    assert key != convtest.cache_key("gfx1010", FAKE_ROCM, False, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert key != convtest.cache_key("gfx1010", FAKE_ROCM, True, {})
    path = tmp_path / convtest.CACHE_FILE
    path.write_text("{not json")
    assert convtest.cached_entry(path, key) is None
    old = {"strategy": "aten", "results": {"aten": {"ok": True, "max_err": 0.0, "error": None}}}
    path.write_text(json.dumps({key: old}))  # chosen by order, before timings existed: tested again
    assert convtest.cached_entry(path, key) is None
    new = {**old, "version": convtest.CACHE_VERSION}
    path.write_text(json.dumps({key: new}))
    assert convtest.cached_entry(path, key) == new


def test_no_working_strategy_is_an_error_and_not_cached(tmp_path, monkeypatch):
    failed = {s: _bad(f"HIP error in {s}") for s in convtest.STRATEGIES}
    monkeypatch.setattr(convtest, "run_selftest", lambda *a, **k: failed)
    with pytest.raises(convtest.SelfTestError, match="no convolution strategy works on gfx1010") as e:
        _resolve(tmp_path)
    assert all(f"{s} failed: HIP error in {s}" in str(e.value) for s in convtest.STRATEGIES)
    assert not (tmp_path / convtest.CACHE_FILE).exists()


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_CACHE_DIR", str(tmp_path / "c"))
    assert convtest.default_cache_dir() == tmp_path / "c"


def test_strategy_names_have_one_source():
    """The CLI, the launcher, the self-test, the patch and the benchmark take the names from one module."""
    from rocm_yolo.conv import strategies as conv_strategies
    from rocm_yolo.request import train_request, validation

    assert validation.CONV_STRATEGIES == conv_strategies.CHOICES == ("auto",) + convtest.STRATEGIES
    assert train_request.CONV_STRATEGIES is conv_strategies.CHOICES
    assert "miopen-off" in conv_strategies.STRATEGIES
    root = Path(convtest.__file__).parent.parent.parent
    for path in (
        "rocm_yolo/conv/patch.py",
        "benchmarks/bench_conv.py",
        "rocm_yolo/conv/selftest.py",
        "rocm_yolo/request/train_request.py",
        "rocm_yolo/request/validation.py",
    ):
        text = (root / path).read_text()
        assert "from rocm_yolo.conv.strategies import" in text, path
        assert '("native", "aten"' not in text, path


def test_doctor_conv_row_shows_the_timings_and_what_auto_picks(tmp_path, monkeypatch):
    """The doctor tests what training would run (the gfx101x presets: fp32, MIOPEN_FIND_MODE=FAST)
    and reports each strategy's time, auto's pick, and the choice training has cached."""
    from rocm_yolo.doctor import WARN, Options, gpu_checks

    seen = {}
    results = {
        "native": _bad("HIP error: invalid device function"),
        "aten": _ok(0.31),
        "fp32": _bad("garbage"),
        "gemm": _ok(0.10),
        "miopen-off": _ok(0.30),
    }

    def run_selftest(device, strategies=convtest.STRATEGIES, timeout=0.0, *, amp=False, timing=None, env=None):
        seen.update(device=device, amp=amp, env=env, timeout=timeout)
        return results

    monkeypatch.setattr(convtest, "run_selftest", run_selftest)
    monkeypatch.setenv("ROCM_YOLO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MIOPEN_FIND_MODE", raising=False)
    key = convtest.cache_key("gfx1010", torch_build(), False)
    cached = {"version": convtest.CACHE_VERSION, "strategy": "aten", "results": {"aten": _ok(0.2), "gemm": _ok(0.5)}}
    (tmp_path / convtest.CACHE_FILE).write_text(json.dumps({key: cached}))
    gpu = GpuNode(node=1, gfx_target_version=100100, arch="gfx1010")
    (row,) = gpu_checks.check_conv(Options(), [gpu], "hip")
    assert row.status == WARN and row.found.endswith("auto picks gemm (gemm 1.0, miopen-off 3.0x, aten 3.1x)")
    assert "--conv gemm" in row.fix
    assert seen["device"] == "cuda" and seen["amp"] is False and seen["env"]["MIOPEN_FIND_MODE"] == "FAST"
    assert seen["timeout"] >= 300
    assert "gemm: ok, 100.0 ms per step, max err 1e-06" in row.details
    assert "native: failed (HIP error: invalid device function)" in row.details
    assert any("cached" in d and "aten (aten 1.0, gemm 2.5x)" in d for d in row.details)
    assert row.data["auto"] == "gemm"
