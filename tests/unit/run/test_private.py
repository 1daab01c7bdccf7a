"""Nobody else gets in (issue 45): rocm-yolo's folder of a run is the user's alone, and no file of a run is written
through a link, a FIFO or a file someone else planted. Real files, links and FIFOs; another user's files where the
tests run as root (``helpers.as_stranger``)."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from helpers import as_stranger
from rocm_yolo.errors import UsageError
from rocm_yolo.process.output import RunLog
from rocm_yolo.run import atomic
from rocm_yolo.run.atomic import append_log, private_dirs, rotated, temporary, write_atomic, write_report
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_002():
    """A umask that lets the group write: what a shared machine's users often have."""
    old = os.umask(0o002)
    yield
    os.umask(old)


def test_the_state_folder_and_its_files_are_the_users_alone_whatever_the_umask(tmp_path, umask_002):
    paths = RunPaths(tmp_path / "run", 1)
    private_dirs(paths.state, paths.node_dir, paths.stacks)
    write_atomic(paths.spec(1), "{}")
    append_log(paths.events, "{}\n")
    with atomic.open_append(paths.trainer_stacks(42)):
        pass
    write_atomic(paths.run_dir / "results.csv", "epoch\n")  # the user's own file: the umask's mode, as Ultralytics'
    for folder in (paths.state, paths.node_dir, paths.stacks):
        assert mode(folder) == 0o700, folder
    for file in (paths.spec(1), paths.events, paths.trainer_stacks(42)):
        assert mode(file) == 0o600, file
    assert mode(paths.run_dir / "results.csv") == 0o664 and mode(paths.run_dir) == 0o775
    os.chmod(paths.state, 0o775)  # an older rocm-yolo's folder, or one someone opened up: closed again
    private_dirs(paths.state)
    assert mode(paths.state) == 0o700


def test_a_state_folder_that_is_a_link_or_another_users_is_refused_in_one_line(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "rocm_yolo").symlink_to(elsewhere)
    with pytest.raises(UsageError) as refused:
        private_dirs(RunPaths(run).state)
    assert "is a symbolic link" in str(refused.value) and "\n" not in str(refused.value)
    assert list(elsewhere.iterdir()) == []
    theirs = tmp_path / "theirs"
    (theirs / "rocm_yolo").mkdir(parents=True)
    as_stranger(theirs / "rocm_yolo")
    with pytest.raises(UsageError, match="belongs to another user"):
        private_dirs(RunPaths(theirs).state)


def test_a_planted_temporary_is_removed_not_written_through(tmp_path):
    """A link where ``.metrics.prom.<pid>.tmp`` goes (the name is predictable: the writer's pid) once destroyed the
    file it pointed at: now the link is removed and the write goes into a new file of its own."""
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    target = tmp_path / "metrics.prom"
    temporary(target).symlink_to(victim)
    write_atomic(target, "new metrics")
    assert victim.read_text() == "the user's file" and target.read_text() == "new metrics"
    assert not temporary(target).exists() and not temporary(target).is_symlink()


def test_logs_and_reports_are_never_written_through_a_link_nor_block_on_a_planted_fifo(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept")
    log = tmp_path / "rocm-yolo.log"
    log.symlink_to(victim)
    with pytest.raises(OSError):
        append_log(log, "a line\n")
    RunLog(log, stream=open(os.devnull, "w")).info("said")  # the run log drops it: never into the victim
    report = tmp_path / "crash-1.txt"
    report.symlink_to(victim)
    with pytest.raises(OSError):
        write_report(report, "traceback")
    assert victim.read_text() == "kept"
    fifo = tmp_path / "events.jsonl"
    os.mkfifo(fifo)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (RunLog(None, fifo).event("x"), done.set()), daemon=True)
    thread.start()
    assert done.wait(30), "an append to a planted FIFO blocked"


def test_a_log_rotates_past_its_limit_and_the_events_of_both_parts_are_read(tmp_path):
    events = tmp_path / "events.jsonl"
    for n in range(40):
        append_log(events, f'{{"event": "e", "n": {n}}}\n', limit=200)
    assert events.stat().st_size <= 200 and rotated(events).stat().st_size <= 200
    found = [e["n"] for e in read_events(events)]
    assert found == sorted(found) and found[-1] == 39 and len(found) < 40  # the oldest dropped, the order kept


def test_a_report_is_0640_and_cut_to_its_end(tmp_path):
    path = write_report(tmp_path / "hang-1-stacks.txt", "x" * 100 + "the end", limit=50)
    text = path.read_text()
    assert mode(path) == 0o640 and text.endswith("the end") and len(text) < 150 and "dropped" in text


def test_a_cache_folder_that_is_a_link_or_another_users_is_never_used(tmp_path, monkeypatch):
    """rocm-yolo's cache holds what runs on the GPU (MIOpen's kernels), the demo set a run trains on, the conv
    self-test's choice and tracebacks: a cache folder someone else made (or linked elsewhere) is refused in one line
    where it would be used, passed over where it is only a convenience (issue 45)."""
    import json

    from rocm_yolo import environment, errors
    from rocm_yolo.conv import selftest
    from rocm_yolo.request.demo import write_demo

    cache = tmp_path / "cache"
    monkeypatch.setenv(environment.CACHE_DIR, str(cache))
    monkeypatch.delenv(environment.DEMO_DIR, raising=False)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    cache.mkdir()
    (cache / "demo-v1").symlink_to(theirs)
    with pytest.raises(UsageError, match="the demo data set in rocm-yolo's cache cannot be used: .* symbolic link"):
        write_demo()
    assert list(theirs.iterdir()) == []
    with pytest.raises(UsageError, match="MIOpen"):
        atomic.check_cache(cache / "miopen" / "gfx1010" / "db", "MIOpen's kernel database")  # fine so far: missing
        (cache / "miopen").mkdir()
        as_stranger(cache / "miopen")
        atomic.check_cache(cache / "miopen" / "gfx1010" / "db", "MIOpen's kernel database")
    choice = cache / "conv-selftest.json"
    choice.write_text(json.dumps({"key": {"strategy": "native"}}))
    assert selftest._load_cache(choice) != {}
    as_stranger(choice)
    assert selftest._load_cache(choice) == {}  # another user's choice: no cache at all
    as_stranger(cache)
    assert errors.save_traceback(ValueError("x"), None) is None  # no traceback into another user's cache
