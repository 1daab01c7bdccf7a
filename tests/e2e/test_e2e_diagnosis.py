"""End to end: the seeds' hang before the first batch ("0/N") is found after the stall timeout, with the default
startup grace (issue 30). (A loader hang after a handled GPU error, among other processes' kernel lines, is in
test_e2e_watchdog.py's worker hang.)
"""

from __future__ import annotations

import pytest

from helpers import TINY, epochs_in, events

pytestmark = pytest.mark.e2e

STALL = 10


def test_a_hang_before_the_first_batch_is_found_after_the_stall_timeout_with_the_default_grace(
    cli, tiny_data, tmp_path
):
    """The seeds' "0/18968": the loader is iterated for the first batch of the run and its workers never deliver.
    The default startup grace (900 s) would have waited 15 minutes; the stall timeout applies."""
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run(
        "train", str(tiny_data), "--epochs", "1", "--stall-timeout", str(STALL), "--workers", "2", *TINY,
        env={"ROCM_YOLO_FAULT": "worker-hang@1:0"}, timeout=200,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:]
    [hang] = events(run, "hang")
    assert hang["class"] == "loader" and hang["epoch"] == 1 and hang["batch"] == 0
    assert hang["seconds"] <= STALL + 30  # the goal: within the stall timeout plus 30 s
    assert "start-up (waiting for the first batch from the train loader): hang" in r.stdout
    assert [e["profile"] for e in events(run, "restart")] == ["safe"] and epochs_in(run) == [1]
    assert cli.leftovers() == []
