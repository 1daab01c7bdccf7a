"""The remedy per class, the stop rules and the verdicts (pure decisions on recorded failures)."""

from __future__ import annotations

from dataclasses import replace

from rocm_yolo import errors
from rocm_yolo.diagnosis import remedies
from rocm_yolo.diagnosis.classes import LADDER, P2P_OFF, SAME, STOP
from rocm_yolo.diagnosis.record import Diagnosis
from rocm_yolo.diagnosis.remedies import Context, decide, smaller_batch
from rocm_yolo.run.supervisor_state import Failure


def failure(
    attempt: int, cls: str, *, signature: str | None = None, epoch=2, batch=3, remedy=None, weak=False
) -> Failure:
    return Failure(
        attempt=attempt,
        kind="crash",
        cls=cls,
        title=cls,
        signature=signature or f"{cls}: x",
        epoch=epoch,
        batch=batch,
        phase="train",
        detected=0.0,
        remedy=remedy,
        weak=weak,
    )


def diagnosis(cls: str, weak: bool = False, **detail) -> Diagnosis:
    return Diagnosis(cls, cls, "" if weak else f"{cls}: x", (), detail, weak)


def test_each_class_gets_its_remedy_the_first_time():
    expected = {
        "loader": LADDER,
        "unknown": LADDER,
        "host-oom": LADDER,
        "gpu-fault": SAME,
        "gpu-hang": SAME,
        "training-error": SAME,
        "data-error": SAME,
        "collective": P2P_OFF,
        "gpu-oom": STOP,
        "environment": STOP,
    }
    for cls, action in expected.items():
        assert decide(failure(1, cls), diagnosis(cls), [], Context(batch=16, imgsz=640)).action == action, cls
    p2p = decide(failure(1, "collective"), diagnosis("collective"), [], Context())
    assert p2p.env == {"NCCL_P2P_DISABLE": "1"} and "rocm-systems#11348" in p2p.reason


def test_the_same_failure_twice_at_the_same_place_stops_the_run():
    first = failure(1, "training-error", remedy=SAME)
    found = decide(failure(2, "training-error"), diagnosis("training-error"), [first], Context())
    assert found.stops and found.exit_code == errors.SAME_FAILURE == 5
    assert found.reason == "the same failure twice at epoch 2, batch 3: not retrying"
    env = decide(failure(2, "host-oom"), diagnosis("host-oom"), [failure(1, "host-oom", remedy=LADDER)], Context())
    assert env.stops and env.exit_code == errors.SETUP and "fewer workers" in env.verdict[0]
    # not the same: another batch, another message, attempts not in a row
    for second in (
        failure(2, "training-error", batch=4),
        failure(2, "training-error", signature="training-error: y"),
        failure(3, "training-error"),
    ):
        assert decide(second, diagnosis("training-error"), [first], Context()).action == SAME
    assert decide(failure(2, "loader"), diagnosis("loader"), [failure(1, "loader", remedy=LADDER)], Context()).stops


def test_a_second_gpu_failure_ends_with_exit_4_and_the_known_fixes_for_the_card():
    context = Context(archs=("gfx1010",), env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, kernel_release="6.8.0-generic")
    first = failure(1, "gpu-fault", epoch=1, batch=9, remedy=SAME)
    found = decide(failure(2, "gpu-hang"), diagnosis("gpu-hang"), [first], context)
    assert (
        found.stops
        and found.exit_code == errors.SETUP
        and found.reason == "gpu-hang at epoch 2, batch 3, the second GPU failure of this run: not retrying"
    )
    text = "\n".join(found.verdict)
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0 on gfx101x: use 10.1.0" in text and "legacy-rocm-build#887" in text
    assert "6.8.0-generic" in text and "compatibility matrix" in text
    assert "cwsr_enable" not in text and "iommu=pt" not in text  # not for this card, not on one GPU
    apu = Context(archs=("gfx1151",), user_args={}, multi_gpu=True)
    text = "\n".join(remedies.verdict(diagnosis("gpu-hang"), apu))
    assert "amdgpu.cwsr_enable=0" in text and "ROCm/ROCm#5724" in text and "iommu=pt" in text
    presets = Context(archs=("gfx1010",), user_args={"amp": True})  # the run turned the gfx101x preset off
    assert "Comfy-Org/ComfyUI#15615" in "\n".join(remedies.verdict(diagnosis("gpu-fault", reason="x"), presets))
    page = "\n".join(remedies.verdict(diagnosis("gpu-fault", reason="page not present"), Context()))
    assert "ROCm/ROCm#5051" in page


def test_a_second_collective_hang_ends_with_the_verdict_for_consumer_cards():
    first = failure(1, "collective", remedy=P2P_OFF)
    found = decide(failure(2, "collective", epoch=3), diagnosis("collective"), [first], Context(env={}))
    assert found.stops and found.exit_code == errors.SETUP
    text = "\n".join(found.verdict)
    assert "HSA_FORCE_FINE_GRAIN_PCIE=1" in text and "ROCm/rccl#92" in text and "iommu=pt" in text
    assert "lspci" in text  # the slots


def test_a_collective_without_room_in_dev_shm_turns_the_shared_memory_transport_off():
    from rocm_yolo.diagnosis.diagnose import diagnose
    from rocm_yolo.diagnosis.record import Evidence

    said = "misc/shmutils.cc:72 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)\n"
    found = diagnose(Evidence("crash", exit_code=1, stderr=said, multi_gpu=True))
    first = decide(failure(1, "collective"), found, [], Context())
    assert first.action == P2P_OFF and first.env == {"NCCL_SHM_DISABLE": "1"} and "NCCL_SHM_DISABLE=1" in first.reason
    again = decide(failure(2, "collective", epoch=3), found, [failure(1, "collective", remedy=P2P_OFF)], Context())
    assert again.stops and "NCCL_SHM_DISABLE=1" in again.reason
    assert "--shm-size" in "\n".join(again.verdict) and "iommu=pt" not in "\n".join(again.verdict)


def test_gpu_out_of_memory_stops_at_once_with_a_smaller_batch():
    gib = 1 << 30
    sizes = {"tried": 2 * gib, "free": gib, "allocated": 6 * gib, "reserved": 0, "total": 8 * gib}
    found = decide(failure(1, "gpu-oom"), diagnosis("gpu-oom", **sizes), [], Context(batch=16, imgsz=640))
    assert found.stops and found.exit_code == errors.SETUP
    # needed 8 GiB at 16, may use 7 GiB: 16 * 0.8 * 7 / 8 = 11.2 -> 8
    assert found.reason == (
        "GPU out of memory at batch 16, imgsz 640: not retrying the same batch; try --batch 8 "
        "(or batch=-1: Ultralytics picks one from the free memory)"
    )
    assert smaller_batch(16, 1, sizes, vram_free=3 * gib) == 4  # what sysfs says is free, when it says
    assert smaller_batch(32, 2, {}, None) == 16  # nothing known: half
    assert smaller_batch(1, 1, sizes, None) is None
    auto = decide(failure(1, "gpu-oom"), diagnosis("gpu-oom"), [], Context(batch=-1, imgsz=640))
    assert auto.reason.endswith("give a fixed, smaller --batch")


def test_the_software_that_cannot_run_on_the_card_stops_at_once_with_the_fix_for_that_card():
    found = decide(failure(1, "environment"), diagnosis("environment"), [], Context(archs=("gfx1010",), env={}))
    assert found.stops and found.exit_code == errors.SETUP == 4
    text = "\n".join(found.verdict)
    assert "torch[device-gfx1010]" in text and "HSA_OVERRIDE_GFX_VERSION=10.1.0" in text and "rocm-yolo doctor" in text
    miopen = remedies.verdict(diagnosis("environment", word="MIOpen cannot build its kernels"), Context(amp=True))
    assert any("--conv gemm" in line for line in miopen) and any("amp=False" in line for line in miopen)
    assert not any("amp=False" in line for line in remedies.verdict(diagnosis("environment"), Context(amp=False)))


def test_a_diagnosis_from_context_alone_retries_and_never_counts_toward_a_stop():
    for cls, action in (("gpu-oom", SAME), ("environment", SAME), ("gpu-fault", SAME), ("host-oom", LADDER)):
        assert decide(failure(1, cls, weak=True), diagnosis(cls, weak=True), [], Context()).action == action, cls
    weak_first = failure(1, "gpu-fault", remedy=SAME, weak=True)
    assert decide(failure(2, "gpu-fault"), diagnosis("gpu-fault"), [weak_first], Context()).action == SAME
    # a signal with no word has no signature: the same place twice is no "same failure"
    silent = replace(failure(1, "unknown", remedy=LADDER), signature="")
    again = replace(silent, attempt=2, remedy=None)
    assert decide(again, Diagnosis("unknown", "killed", ""), [silent], Context()).action == LADDER


def test_the_oom_advice_starts_from_the_batch_that_failed_not_the_one_asked_for():
    from rocm_yolo.diagnosis import evidence

    halved = Context(batch=2, imgsz=640)  # Ultralytics halved 16 to 2 before it gave up (evidence.failed_batch)
    found = decide(failure(1, "gpu-oom"), diagnosis("gpu-oom"), [], halved)
    assert "at batch 2" in found.reason and "--batch 1 " in found.reason
    assert evidence.failed_batch.__doc__  # the batch comes from the trainer's own crash event
