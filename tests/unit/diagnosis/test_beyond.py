"""Evidence beyond the failure's text (issue 44): the run's cgroup's OOM kills, the labels against nc, the kernel's view
of a hung tree's threads, the GPU override against the card; gathered from its source (sources.py), read by the rules
(beyond.py, hangs.from_threads) with the text's own classes unchanged where it says nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

from rocm_yolo.diagnosis import sources
from rocm_yolo.diagnosis.diagnose import (
    DATA_ERROR,
    ENVIRONMENT,
    GPU_FAULT,
    GPU_HANG,
    HOST_OOM,
    LOADER,
    TRAINING_ERROR,
    UNKNOWN,
    Evidence,
    diagnose,
)
from rocm_yolo.diagnosis.remedies import Context, decide, host_memory, verdict
from rocm_yolo.gpu.arch import detect_gpus
from rocm_yolo.process.cgroup import CgroupMemory
from rocm_yolo.process.kernel_view import ThreadView
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run.supervisor_state import Failure

HSA = (
    "Memory access fault by GPU node-1 (Agent handle: 0x55d5c0a3e2a0) on address 0x7f3a1c000000. "
    "Reason: Page not present or supervisor privilege."
)
WORKER = "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed."
INDEX = 'Traceback (most recent call last):\n  File "/x/torch/nn/functional.py", line 3, in cross_entropy\n'
INDEX += "IndexError: Target 7 is out of bounds."
BAD = "/d/labels/train/img_3.txt:2: class id 7 out of range (names has 3: 0-2)"


def crash(**kw) -> Evidence:
    return Evidence(failure="crash", kernel_source="kernel log not readable (a container)", **kw)


def test_a_sigkill_the_runs_cgroup_counted_as_an_oom_kill_is_host_memory_strong():
    for e in (
        crash(exit_code=-9, cgroup_kills=1, cgroup_limit=8 << 30, cgroup_source="cgroup v2 /x (memory.events)"),
        crash(exit_code=1, stderr=WORKER, cgroup_kills=2, cgroup_limit=None, cgroup_source="cgroup v1 /y"),
    ):
        d = diagnose(e)
        assert d.cls == HOST_OOM and not d.weak and d.signature == HOST_OOM, d
        assert "cgroup counted" in d.title and e.cgroup_source in d.evidence
    assert "it allows 8.0 GiB" in diagnose(crash(exit_code=-9, cgroup_kills=1, cgroup_limit=8 << 30)).title


def test_a_worker_gone_without_a_word_while_the_cgroup_counted_an_oom_kill_is_host_memory():
    """torch says a worker "exited unexpectedly" when it finds it dead without its signal: the cgroup's count says
    whether the OOM killer ended it."""
    gone = "RuntimeError: DataLoader worker (pid(s) 8260) exited unexpectedly"
    counted = diagnose(crash(exit_code=1, stderr=gone, cgroup_kills=1, cgroup_source="cgroup v2 /x"))
    assert counted.cls == HOST_OOM and not counted.weak and "worker gone" in counted.detail["victim"]
    for kills in (0, None):  # counted none, or not read: the loader's own words decide
        assert diagnose(crash(exit_code=1, stderr=gone, cgroup_kills=kills)).cls == LOADER


def test_a_sigkill_the_cgroup_did_not_count_is_no_oom_and_an_unreadable_one_is_the_old_guess():
    none = diagnose(crash(exit_code=-9, cgroup_kills=0, cgroup_source="cgroup v2 /x"))
    assert none.cls == UNKNOWN and "counted no OOM kill" in none.title and not none.weak
    worker = diagnose(crash(exit_code=1, stderr=WORKER, cgroup_kills=0, cgroup_source="cgroup v2 /x"))
    assert worker.cls == LOADER and "counted no OOM kill" in worker.title
    unread = diagnose(crash(exit_code=-9, cgroup_source="cgroup not readable (no memory cgroup named)"))
    assert unread.cls == HOST_OOM and unread.weak and "cgroup not readable" in unread.title
    other = diagnose(crash(exit_code=-6, stderr=HSA, cgroup_kills=1))  # the runtime's own words decide
    assert other.cls == GPU_FAULT


def test_an_index_error_with_labels_out_of_range_is_a_data_error_naming_the_file_and_line():
    d = diagnose(crash(exit_code=1, traceback=INDEX, labels=(BAD,), labels_source="8 of 8 train label files"))
    assert d.cls == DATA_ERROR and BAD in d.title and d.detail["file"] == "/d/labels/train/img_3.txt"
    assert BAD in d.evidence and "check_label" in d.why
    assert diagnose(crash(exit_code=1, traceback=INDEX, labels_source="8 of 8")).cls == TRAINING_ERROR  # labels fine
    assert (
        diagnose(crash(exit_code=1, stderr="RuntimeError: CUDA error: device-side assert triggered", labels=(BAD,))).cls
        == DATA_ERROR
    )
    other = 'Traceback (most recent call last):\n  File "/x/y.py", line 1, in f\nKeyError: 3'
    assert diagnose(crash(exit_code=1, traceback=other, labels=(BAD,))).cls == TRAINING_ERROR  # no index error


def test_a_gpu_fault_with_an_override_of_another_architecture_is_the_environment_and_stops():
    e = crash(exit_code=-6, stderr=HSA, overrides=(("gfx1100", "10.3.0"),))
    d = diagnose(e)
    assert d.cls == ENVIRONMENT and "HSA_OVERRIDE_GFX_VERSION=10.3.0 on a gfx1100 card" in d.title
    assert "runs it as gfx1030" in d.title and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in d.evidence
    failure = Failure(1, "crash", d.cls, d.title, d.signature, 1, 2, "train", 0.0)
    decision = decide(failure, d, [], Context(archs=("gfx1100",), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}))
    assert decision.stops and decision.exit_code == 4
    assert "no HSA_OVERRIDE_GFX_VERSION (unset it" in decision.verdict[1]  # the fix first: none, not a retry
    rdna1 = diagnose(crash(exit_code=-6, stderr=HSA, overrides=(("gfx1010", "10.3.0"),)))
    fixes = "\n".join(verdict(rdna1, Context(archs=("gfx1010",))))
    assert rdna1.cls == ENVIRONMENT and "HSA_OVERRIDE_GFX_VERSION=10.1.0 for a gfx1010 card instead of 10.3.0" in fixes


def test_the_override_a_card_needs_or_its_own_is_not_the_cause():
    for override in (("gfx1031", "10.3.0"), ("gfx1030", "10.3.0"), ("gfx1100", "11.0.0")):
        assert diagnose(crash(exit_code=-6, stderr=HSA, overrides=(override,))).cls == GPU_FAULT, override
    hang = "HW Exception by GPU node-1 (Agent handle: 0x1) reason :GPU Hang"
    assert diagnose(crash(exit_code=-6, stderr=hang, overrides=(("gfx1100", "10.3.0"),))).cls == GPU_HANG


def kfd(pid=40, role="trainer", state="S") -> ThreadView:
    return ThreadView(pid, pid, role, state, "kfd_wait_on_events", "ioctl", "/dev/kfd")


def futex(pid=40, tid=40, role="trainer") -> ThreadView:
    return ThreadView(pid, tid, role, "S", "futex_wait_queue", "futex")


def hang(**kw) -> Evidence:
    outer = (
        "===== pid 40 (trainer, sleeping): python -m rocm_yolo.trainer s.json\nCurrent thread 0x1 (most recent call "
    )
    outer += 'first):\n  File "/x/ultralytics/engine/trainer.py", line 1 in _do_train\n'
    return Evidence(failure="hang", stacks=outer, **kw)


def test_a_hang_with_only_outer_frames_is_named_by_where_the_kernel_says_the_main_thread_waits():
    assert diagnose(hang()).cls == UNKNOWN  # the stacks alone: only the loop's outer frames
    gpu = diagnose(hang(threads=(kfd(), futex(tid=41))))
    assert gpu.cls == GPU_HANG and "/dev/kfd" in gpu.title and gpu.signature.startswith(GPU_HANG)
    nv = ThreadView(40, 40, "trainer", "D", "", "ioctl", "/dev/nvidia0")
    assert diagnose(hang(threads=(nv,))).cls == GPU_HANG
    gone = diagnose(hang(threads=(futex(),), workers=(51, 52)))  # the workers recorded, none alive
    assert gone.cls == LOADER and "workers are gone (pids 51, 52)" in gone.title
    alive = diagnose(hang(threads=(futex(), futex(51, 51, "worker")), workers=(51, 52)))
    assert alive.cls == UNKNOWN  # a worker lives: the queue may yet fill; the stacks decide, and named nothing
    assert "the kernel: trainer pid 40: state S, in futex" in alive.title
    helper = diagnose(
        hang(threads=(futex(), ThreadView(40, 41, "trainer", "S", "kfd_wait_on_events", "ioctl", "/dev/kfd")))
    )
    assert helper.cls == UNKNOWN  # the HIP runtime's event thread waits on the KFD always: the main thread decides
    assert diagnose(hang(threads=(kfd(state="T"),))).cls == UNKNOWN  # stopped: no wait of its own


def test_the_cgroup_reading_the_labels_and_the_override_from_their_sources(tmp_path, monkeypatch):
    before, after = (
        CgroupMemory("/cg", 3, None, version=2),
        CgroupMemory("/cg", 4, 2 << 30, "/cg/memory.max", version=2),
    )
    kills, limit, said = sources.cgroup_kills((before, after))
    assert (kills, limit) == (1, 2 << 30) and "oom_kill 3 at the attempt's start, 4 at its end" in said
    assert sources.cgroup_kills((before, CgroupMemory(why="cgroup not readable (x)")))[0] is None
    assert sources.cgroup_kills(None)[2] == "cgroup not read"

    data = write_demo(tmp_path / "demo", train=6, val=2, size=32)
    label = sorted((data.parent / "labels" / "train").glob("*.txt"))[2]
    label.write_text(label.read_text() + "7 0.5 0.5 0.2 0.2\n")
    from rocm_yolo.run.spec import RunSpec

    spec = RunSpec(str(data), "yolo26n.yaml", str(tmp_path / "run"), "fast", None, True, {})
    bad, checked = sources.labels(spec, "train")
    assert len(bad) == 1 and bad[0].startswith(f"{label}:") and "class id 7 out of range (names has 3" in bad[0]
    assert "6 of 6 train label files checked against nc=3" in checked
    assert sources.labels(spec, "val")[0] == ()
    partial, said = sources.labels(spec, "train", budget=-1)  # no time: nothing checked, and said
    assert partial == () and said.startswith("0 of 6 train label files (the first 0: its time was up)")

    nodes = Path(__file__).resolve().parents[2] / "seams" / "kfd" / "nodes"  # two gfx1100 cards, nodes 1 and 2
    gpus = detect_gpus(nodes)
    assert sources.overrides(spec, gpus) == ()
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    assert sources.overrides(spec, gpus) == (("gfx1100", "10.3.0"),)  # GPU 0, Ultralytics' default
    two = RunSpec(
        str(data),
        "m.yaml",
        str(tmp_path),
        "fast",
        None,
        True,
        {"device": "0,1"},
        env={"HSA_OVERRIDE_GFX_VERSION_2": "11.0.0"},
    )
    assert sources.overrides(two, gpus) == (("gfx1100", "10.3.0"), ("gfx1100", "11.0.0"))
    shutil.rmtree(tmp_path / "demo")
    assert "labels not checked" in sources.labels(spec, "train")[1]


def test_host_memory_says_what_the_cgroup_allows_and_what_cache_workers_and_batch_cost():
    d = diagnose(crash(exit_code=-9, cgroup_kills=1, cgroup_limit=8 << 30, cgroup_source="cgroup v2 /x"))
    context = Context(batch=16, imgsz=640, workers=8, prefetch=4, cache_bytes=3 << 30, memory_total=32 << 30)
    said = host_memory(d, context)
    assert said.startswith("the run's cgroup allows 8.0 GiB (the machine has 32.0 GiB)")
    assert "cache=ram holds about 3.0 GiB" in said and "8 DataLoader workers hold 4 batches each" in said
    assert "about 600 MiB" in said and "batch 16 at imgsz 640" in said
    failure = Failure(1, "crash", d.cls, d.title, d.signature, 1, 2, "train", 0.0)
    assert decide(failure, d, [], context).reason == said  # said with the restart down the ladder


def test_on_several_gpus_a_rank_killed_by_sigkill_the_cgroup_counted_is_host_memory():
    launcher = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-25_07:25:15\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4251)\n  error_file: <N/A>\n"
    )
    peer = 'Traceback (most recent call last):\n  File "/x/t.py", line 1, in f\nRuntimeError: Connection closed by peer'
    e = crash(exit_code=1, traceback=peer, launcher=launcher, multi_gpu=True, cgroup_kills=1, cgroup_source="cg")
    d = diagnose(e)
    assert d.cls == HOST_OOM and not d.weak and d.evidence[0] == "rank 1 killed by SIGKILL"
