"""Profiles and the one place where loader settings are validated."""

from __future__ import annotations

import dataclasses

import pytest

from rocm_yolo.errors import UsageError
from rocm_yolo.policy.profiles import (
    DEFAULT_LADDER,
    PROFILES,
    next_profile,
    parse_ladder,
    resolve,
)


def test_profiles_are_frozen_and_match_the_issue():
    fast, safe, single = PROFILES["fast"], PROFILES["safe"], PROFILES["single"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.prefetch_factor = 8
    assert (fast.default_workers, fast.persistent_workers, fast.prefetch_factor, fast.val) == (4, True, 4, True)
    assert (safe.worker_divisor, safe.persistent_workers, safe.prefetch_factor, safe.pin_memory, safe.val) == (
        2,
        False,
        2,
        False,
        False,
    )
    assert dict(safe.env) == {"OMP_NUM_THREADS": "2"}
    assert (single.max_workers, single.val) == (0, True)
    for p in PROFILES.values():  # every profile states its cap for the validation loader
        assert "val workers" in dict(p.rows())


def test_fast_takes_requested_workers_from_the_forkserver_and_persistence():
    r = resolve("fast", 2, cpu_count=8)
    assert r.loader.workers == 2 and r.loader.start_method == "forkserver"
    assert r.loader.persistent_workers and r.loader.prefetch_factor == 4 and r.val
    assert resolve("fast", None, cpu_count=8).loader.workers == 4


def test_safe_halves_workers_and_turns_validation_off():
    r = resolve("safe", 8, cpu_count=16)
    assert r.loader.workers == 4 and r.loader.val_workers == 4 and not r.loader.persistent_workers
    assert r.loader.prefetch_factor == 2 and r.loader.pin_memory is False and r.val is False
    assert r.env == {"OMP_NUM_THREADS": "2"} and any("workers=8 -> 4" in w for w in r.warnings)
    assert (
        resolve("safe", 1, cpu_count=16).loader.workers == 1 and resolve("safe", None, cpu_count=16).loader.workers == 2
    )


def test_single_has_no_worker_settings_torch_would_reject():
    r = resolve("single", None, cpu_count=4)
    assert r.loader.workers == 0 and r.loader.prefetch_factor is None and not r.loader.persistent_workers
    assert r.loader.val_workers == 0


def test_workers_above_cpu_count_warn_and_cap():
    r = resolve("fast", 64, cpu_count=2)
    assert r.loader.workers == 2
    assert any("more than the 2 CPUs" in w for w in r.warnings)
    default = resolve("fast", None, cpu_count=2)  # the profile's default of 4, which the user never set
    assert default.loader.workers == 2 and not default.warnings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": -1}, "workers=-1 must be >= 0"),
        ({"workers": "two"}, "is not an integer"),
        ({"workers": 1.5}, "is not an integer"),
        ({"workers": True}, "is not an integer"),
        ({"workers": 0, "overrides": {"prefetch_factor": 2}}, "prefetch_factor needs workers > 0"),
        ({"workers": 0, "overrides": {"persistent_workers": True}}, "persistent_workers=true needs workers > 0"),
        ({"overrides": {"prefetch_factor": 0}}, "prefetch_factor=0 must be >= 1"),
        ({"overrides": {"timeout": -3}}, "must be >= 0"),
        ({"overrides": {"start_method": "thread"}}, "choose one of forkserver, spawn, fork"),
        ({"overrides": {"persistent_workers": "maybe"}}, "is not a boolean"),
    ],
)
def test_bad_settings_are_one_line_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as e:
        resolve("fast", kwargs.get("workers"), kwargs.get("overrides"), cpu_count=8)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_profile():
    with pytest.raises(UsageError, match="unknown profile 'turbo'"):
        resolve("turbo")


def test_overrides_merge_onto_the_profile():
    r = resolve("safe", 2, {"persistent_workers": "true", "prefetch_factor": 3, "pin_memory": True}, cpu_count=4)
    assert r.loader.persistent_workers and r.loader.prefetch_factor == 3 and r.loader.pin_memory is True
    fork = resolve("fast", 1, {"start_method": "fork"}, cpu_count=4)
    assert fork.loader.start_method == "fork"
    assert any("fork" in w for w in fork.warnings)


def test_fallback_ladder():
    assert parse_ladder("fast, safe,single") == ("fast", "safe", "single")
    assert next_profile("fast", ("fast", "safe", "single")) == "safe"
    assert next_profile("single", ("fast", "safe", "single")) == "single"
    with pytest.raises(UsageError):
        parse_ladder("fast,warp")


def test_the_default_ladder_reaches_threads_then_single():
    """Each restart steps down once: worker processes, then threads in the trainer, then the bare main thread."""
    steps, current = [], "fast"
    for _ in range(4):
        current = next_profile(current, DEFAULT_LADDER)
        steps.append(current)
    assert steps == ["safe", "threads", "single", "single"]
    assert PROFILES["threads"].threads > 0 and PROFILES["threads"].max_workers == 0  # no worker process
    assert PROFILES["single"].threads == 0 and PROFILES["single"].max_workers == 0  # nor a loader thread


def test_threads_profile_settings_and_their_errors():
    big = resolve("threads", None, cpu_count=16)
    assert (big.loader.workers, big.loader.threads, big.loader.prefetch_factor) == (0, 8, 2)
    assert big.loader.pin_memory is None and big.loader.timeout == 0 and big.val and not big.warnings
    assert resolve("threads", None, cpu_count=2).loader.threads == 2  # capped by the CPU count
    r = resolve("threads", None, {"threads": 4, "prefetch_factor": 3, "timeout": 60}, cpu_count=16)
    assert (r.loader.threads, r.loader.prefetch_factor, r.loader.timeout) == (4, 3, 60)
    assert r.loader.describe() == "workers=0 threads=4 (in the trainer process) prefetch=3 pin_memory=auto timeout=60"
    r = resolve("threads", None, {"threads": 32}, cpu_count=16)
    assert r.loader.threads == 16 and any("threads=32 is more than the 16 CPUs" in w for w in r.warnings)
    r = resolve("threads", 4, cpu_count=16)
    assert r.loader.workers == 0 and any(
        "workers=4 ignored (set its loader threads with threads=N)" in w for w in r.warnings
    )
    for profile, value, message in [
        ("fast", 4, "add --profile threads"),
        ("single", 2, "add --profile threads"),
        ("threads", 0, "threads=0 must be >= 1"),
        ("threads", "two", "not an integer"),
    ]:
        with pytest.raises(UsageError, match=message):
            resolve(profile, None, {"threads": value}, cpu_count=16)
    single = resolve("single", None, cpu_count=16).loader
    assert single.threads == 0 and single.prefetch_factor is None  # single stays strictly single-threaded
    rows = {name: dict(p.rows()) for name, p in PROFILES.items()}
    assert rows["threads"]["loader threads"] == "min(8, CPUs)" and rows["threads"]["prefetch_factor"] == "2 per thread"
    assert rows["single"]["loader threads"] == "-" and rows["single"]["prefetch_factor"] == "-"
    assert DEFAULT_LADDER == ("fast", "safe", "threads", "single")
    assert [next_profile(p, DEFAULT_LADDER) for p in DEFAULT_LADDER] == ["safe", "threads", "single", "single"]


def test_a_profile_off_the_ladder_steps_down_never_back_to_worker_processes():
    from rocm_yolo.policy.profiles import next_profile

    assert next_profile("threads", ("fast", "safe", "single")) == "single"
    assert next_profile("safe", ("fast", "threads")) == "threads"
    assert next_profile("single", ("fast", "safe")) == "single"  # nothing safer on it: it stays
