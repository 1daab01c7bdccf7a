"""The testing plugin's grammar: a fault listed twice fires twice, same-crash every time."""

from __future__ import annotations

from rocm_yolo.run.paths import RunPaths
from rocm_yolo.testing import faults


def test_a_fault_listed_twice_fires_in_two_attempts_and_same_crash_in_every_one(tmp_path):
    paths = RunPaths(tmp_path)
    paths.state.mkdir()
    first, second, same = faults.parse("gpu-fault@2:1,gpu-fault@2:1,same-crash@1:2")
    assert (first.nth, second.nth, same.nth) == (0, 1, 0) and (second.epoch, second.batch) == (2, 1)
    assert faults.claim(first, paths) and not faults.claim(first, paths)  # attempt 1: the first item
    assert faults.claim(second, paths) and not faults.claim(second, paths)  # attempt 2: the second
    assert all(faults.claim(same, paths) for _ in range(3))
    assert len(paths.fault_fired("gpu-fault").read_text().splitlines()) == 2
