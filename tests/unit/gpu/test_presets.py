"""gfx101x presets: what they set, what the user's own settings keep, what the run header says."""

from __future__ import annotations

import pytest

from rocm_yolo.gpu.presets import Preset, header_lines, override_advice, presets

ENV = {"HOME": "/home/ann"}


def _by_key(items: list[Preset]) -> dict[str, Preset]:
    return {p.key: p for p in items}


def test_gfx1010_presets():
    got = _by_key(presets("gfx1010", {}, ENV))
    assert {k: (p.kind, p.value) for k, p in got.items()} == {
        "amp": ("arg", False),
        "channels_last": ("arg", False),
        "conv": ("tool", "auto"),
        "MIOPEN_FIND_MODE": ("env", "FAST"),
        "PYTORCH_MIOPEN_SUGGEST_NHWC": ("env", "0"),
        "MIOPEN_USER_DB_PATH": ("env", "/home/ann/.cache/rocm-yolo/miopen/gfx1010/db"),
        "MIOPEN_CUSTOM_CACHE_DIR": ("env", "/home/ann/.cache/rocm-yolo/miopen/gfx1010/cache"),
    }
    assert not any(p.user_set for p in got.values())
    assert all(p.reason for p in got.values())


def test_user_settings_are_marked_not_overridden():
    env = {**ENV, "MIOPEN_USER_DB_PATH": "/tmp/db", "MIOPEN_FIND_MODE": "NORMAL", "XDG_CACHE_HOME": "/var/cache/ann"}
    got = _by_key(presets("gfx1012", {"amp": True, "conv": "gemm", "channels_last": None}, env))
    assert got["amp"].user_set and got["conv"].user_set and got["MIOPEN_FIND_MODE"].user_set
    assert not got["PYTORCH_MIOPEN_SUGGEST_NHWC"].user_set
    assert got["amp"].value is False  # the preset's value; the caller keeps the user's
    assert not got["channels_last"].user_set  # None is Ultralytics' "not set"
    assert got["MIOPEN_USER_DB_PATH"].user_set and not got["MIOPEN_CUSTOM_CACHE_DIR"].user_set
    assert got["MIOPEN_CUSTOM_CACHE_DIR"].value == "/var/cache/ann/rocm-yolo/miopen/gfx1012/cache"


def test_miopen_cache_is_kept_apart_per_hsa_override():
    got = _by_key(presets("gfx1010", {}, {**ENV, "HSA_OVERRIDE_GFX_VERSION": "10.3.0"}))
    assert got["MIOPEN_CUSTOM_CACHE_DIR"].value == "/home/ann/.cache/rocm-yolo/miopen/gfx1010-hsa10.3.0/cache"


@pytest.mark.parametrize("arch", [None, "gfx1030", "gfx1100", "gfx90a", "gfx10100"])
def test_no_presets_on_cpu_cuda_or_other_archs(arch):
    assert presets(arch, {"amp": True}, ENV) == []
    assert override_advice(arch, ENV) is None


def test_header_lines_mark_user_settings():
    items = presets("gfx1010", {"amp": True}, ENV)
    lines = header_lines("gfx1010", items)
    assert lines[0].startswith("GPU architecture: gfx1010")
    amp = next(line for line in lines if " amp" in line)
    assert "user-set" in amp and "False" in amp
    assert any("channels_last=False" in line and "preset:" in line for line in lines)
    assert header_lines(None, []) == ["GPU architecture: none detected (no presets)"]


def test_override_advice():
    assert "not set" in override_advice("gfx1010", ENV)
    assert "10.3.0" in override_advice("gfx1010", {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
