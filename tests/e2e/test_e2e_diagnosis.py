"""End to end: what failed is read from the failure's own evidence, in real Ultralytics training (issue 30).

A GPU error's words that the trainer handled, and other processes' kernel lines (Xorg's page faults on a card,
another program's OOM-killer death) that come while the run trains, decide nothing: a DataLoader hang after them
is a loader hang, and the run recovers down the ladder. The seeds' hang before the first batch ("0/N") is found
after the stall timeout, with the default startup grace. The kernel log is a test's file (tests/seams).
"""

from __future__ import annotations

import threading

import pytest

from helpers import TINY, epochs_in, events, kernel_line, with_kernel_log
from rocm_yolo.run.paths import RunPaths

pytestmark = pytest.mark.e2e

STALL = 10
XORG = (
    "amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:6 pasid:32770, for process Xorg pid "
    "901 thread Xorg:cs0 pid 955)"
)
CHROME = "Out of memory: Killed process 99999999 (chrome) total-vm:8000kB, anon-rss:7000kB"  # no pid of this machine


def test_a_loader_hang_after_a_handled_hip_error_among_other_processes_kernel_lines_is_a_loader_hang(
    cli, tiny_data, tmp_path
):
    run = tmp_path / "runs" / "detect" / "train"
    kernel = with_kernel_log(cli, tmp_path)
    stop = threading.Event()

    def others() -> None:  # while the run trains, other processes fault on a card and die for memory
        while not stop.wait(0.5):
            with open(kernel, "a") as f:
                f.write(kernel_line(XORG) + kernel_line(CHROME))

    writer = threading.Thread(target=others, daemon=True)
    writer.start()
    try:
        r = cli.run(
            "train", str(tiny_data), "--epochs", "2", "--stall-timeout", str(STALL), "--workers", "2",
            "prefetch_factor=1", *TINY, env={"ROCM_YOLO_FAULT": "handled-hip-error@1:1,worker-hang@1:3"},
        )  # fmt: skip
    finally:
        stop.set()
        writer.join()
    assert r.returncode == 0, r.stdout[-4000:]
    assert "RuntimeError: HIP error: invalid device function" in RunPaths(run).child_stderr(1).read_text()
    [hang] = events(run, "hang")
    assert hang["class"] == "loader" and not hang["weak"], hang
    assert [e["profile"] for e in events(run, "restart")] == ["safe"]  # down the ladder
    assert events(run, "crash") == [] and epochs_in(run) == [1, 2]
    report = (run / "hang-1-stacks.txt").read_text().split("--- rocm-yolo diagnosis:", 1)[1]
    decided, rest = report.split("why:", 1)
    assert "Xorg" not in decided and "chrome" not in decided and "invalid device function" not in decided
    others_section = rest.split("kernel lines of other processes or cards (never this run's):", 1)[1]
    assert "for process Xorg pid 901" in others_section and "(chrome)" in others_section
    assert cli.leftovers() == []


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
