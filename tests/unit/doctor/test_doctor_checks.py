"""rocm-yolo doctor's checks: fake device trees, real data sets, bounded subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import rows_by_check
from rocm_yolo import doctor
from rocm_yolo.cli import build_parser
from rocm_yolo.doctor import FAIL, OK, SKIP, WARN, Options, checks, gpu_checks, hsa_override
from rocm_yolo.doctor import cli as doctor_cli
from rocm_yolo.doctor import system as doctor_system
from rocm_yolo.ultralytics_rules.data import datasets
from taskdata import TASKS, copy_task

ALL_BUT = lambda *keep: ",".join(c for c in doctor.CHECKS if c not in keep)  # noqa: E731


def test_missing_data_file_is_a_one_line_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rocm_yolo.doctor", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == doctor.EXIT_USAGE
    assert proc.stderr.strip().count("\n") == 0 and "data file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--skip", "bogus"], "unknown check"),
        (["--workers", "-1"], "--workers"),
        (["--profile", "turbo"], "unknown profile"),
    ],
)
def test_bad_options_exit_2(argv, words, capsys):
    assert doctor.main(argv) == doctor.EXIT_USAGE
    assert words in capsys.readouterr().err


def test_shared_memory_is_sized_as_the_run_would_be(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_DEMO_DIR", str(tmp_path / "demo"))
    parse = build_parser().parse_args
    demo = doctor_cli.options_from_args(parse(["doctor", "demo", "--skip", "data"]))
    assert (demo.batch, demo.imgsz) == (8, 64)  # the demo trains at batch 8, 64 px
    mine = tmp_path / "data.yaml"
    mine.write_text("train: images\nval: images\nnames: [a]\n")
    mine_opts = doctor_cli.options_from_args(parse(["doctor", str(mine)]))
    assert (mine_opts.batch, mine_opts.imgsz) == (16, 640)
    given = doctor_cli.options_from_args(parse(["doctor", "demo", "--batch", "32", "--imgsz", "320"]))
    assert (given.batch, given.imgsz) == (32, 320)


def test_conclusion_and_exit_code():
    rows = [doctor.Row("a", "a", OK, "fine"), doctor.Row("b", "b", WARN, "hmm")]
    assert doctor.exit_code(rows) == 0 and "Nothing blocks training" in doctor.conclusion(rows)
    rows.append(doctor.Row("c", "DataLoader", FAIL, "hang", data={"verdict": "use --profile single"}))
    assert doctor.exit_code(rows) == 1 and doctor.conclusion(rows).endswith("use --profile single")
    text = doctor.format_report(rows)
    assert "✓ a" in text and "⚠ b" in text and "✗ DataLoader" in text


@pytest.mark.parametrize(
    "arch, value, status, words",
    [
        ("gfx1010", None, OK, "not set"),
        ("gfx1010", "10.3.0", WARN, "reported to crash gfx101x cards"),
        ("gfx1012", "10.3.0", WARN, "reported to crash gfx101x cards"),
        ("gfx1010", "10.2.0", WARN, "another family"),
        ("gfx1010", "10.1.0", OK, "matches"),
        ("gfx1012", "10.1.0", OK, "fits"),
        ("gfx1031", "10.3.0", OK, "fits"),
        ("gfx1030", "11.0.0", FAIL, "another generation"),
        ("gfx1010", "ten", FAIL, "X.Y.Z"),
        (None, "10.3.0", WARN, "no AMD GPU"),
    ],
)
def test_hsa_override_against_arch(arch, value, status, words):
    row = hsa_override.override_row(arch, value)
    assert row.status == status and words in row.found
    if value == "10.3.0" and (arch or "").startswith("gfx101"):
        assert "HSA_OVERRIDE_GFX_VERSION=10.1.0" in row.fix and "ROCm/legacy-rocm-build#887" in row.fix


def fake_root(tmp_path, *, members="", devices=True, gfx=100100) -> Path:
    root = tmp_path / "root"
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 8\ngfx_target_version 0\n")
    (nodes / "1").mkdir()
    (nodes / "1/properties").write_text(
        f"gfx_target_version {gfx}\nvendor_id 4098\ndevice_id 29471\ndrm_render_minor 128\n"
    )
    (root / "etc").mkdir()
    (root / "etc/group").write_text(f"root:x:0:\nvideo:x:44:{members}\nrender:x:110:{members}\n")
    if devices:
        (root / "dev/dri").mkdir(parents=True)
        for dev in (root / "dev/kfd", root / "dev/dri/renderD128"):
            dev.write_text("")
            os.chown(dev, 0, 110) if os.geteuid() == 0 else None
            dev.chmod(0o660)
    return root


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="fake device files need chown to a render gid")


@needs_root
def test_user_outside_render_group_gets_usermod_fix(tmp_path):
    opts = Options(root=fake_root(tmp_path), uid=1000, user="alice", groups=frozenset({"alice"}))
    gpus, why = gpu_checks.detect_gpus(opts)
    assert [g.arch for g in gpus] == ["gfx1010"]
    rows = rows_by_check(gpu_checks.check_gpu(opts, gpus, why))
    assert rows["gpu.arch"].status == OK and "gfx1010" in rows["gpu.arch"].found
    assert rows["gpu.devices"].status == FAIL and "/dev/kfd" in rows["gpu.devices"].found
    assert rows["gpu.groups"].status == FAIL
    assert "sudo usermod -aG render,video $USER" in rows["gpu.groups"].fix and "log out" in rows["gpu.groups"].fix


@needs_root
def test_group_added_but_session_not_refreshed(tmp_path):
    opts = Options(root=fake_root(tmp_path, members="alice"), uid=1000, user="alice", groups=frozenset({"alice"}))
    rows = rows_by_check(gpu_checks.check_gpu(opts, *gpu_checks.detect_gpus(opts)))
    assert rows["gpu.groups"].status == FAIL and "log out" in rows["gpu.groups"].fix


@needs_root
def test_member_of_render_and_video_is_fine(tmp_path):
    opts = Options(
        root=fake_root(tmp_path, members="alice"),
        uid=1000,
        user="alice",
        groups=frozenset({"alice", "render", "video"}),
    )
    rows = rows_by_check(gpu_checks.check_gpu(opts, *gpu_checks.detect_gpus(opts)))
    assert rows["gpu.devices"].status == OK and rows["gpu.groups"].status == OK


def test_missing_device_files_in_a_container(tmp_path):
    opts = Options(root=fake_root(tmp_path, devices=False), uid=0, user="root", groups=frozenset({"root"}))
    rows = rows_by_check(gpu_checks.check_gpu(opts, *gpu_checks.detect_gpus(opts)))
    assert rows["gpu.devices"].status == FAIL and "--device=/dev/kfd" in rows["gpu.devices"].fix


def test_no_gpu_rows_are_skipped_not_failed(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    opts = Options(root=root, skip=frozenset({"data", "loader", "kernel", "start", "shm"}))
    rows = list(checks.run_all(opts))
    by = rows_by_check(rows)
    assert by["gpu.arch"].status == SKIP and by["gpu.kernel"].status == SKIP and by["conv.selftest"].status == SKIP
    assert doctor.exit_code(rows) == 0 or by["versions.torch"].status == FAIL


def test_docker_default_shm_is_too_small():
    plan = {"workers": 8, "val_workers": 16, "prefetch": 4}
    need = doctor_system.shm_need(8, 16, 4, 16, 640)
    assert need == 4 * (8 * 16 + 16 * 32) * 3 * 640 * 640
    row = doctor_system.shm_row(64 * 2**20, 64 * 2**20, need, plan, "test")
    assert row.status == FAIL and "Docker's default" in row.found
    assert "--shm-size=8g" in row.fix and "--ipc=host" in row.fix
    assert doctor_system.shm_row(32 * 2**30, 32 * 2**30, need, plan, "test").status == OK
    assert doctor_system.shm_row(32 * 2**30, 2**20, need, plan, "test").status == WARN


def test_cache_ram_counts_in_the_shared_memory_need(tmp_path, monkeypatch):
    """``--cache ram``: the demo's 24 images at imgsz 32 (72 KiB) count twice in /dev/shm when Ultralytics shares its
    cache there; with too little free, or an Ultralytics that copies it per worker, a warning with the fixes."""
    from rocm_yolo.request.demo import write_demo
    from rocm_yolo.ultralytics_rules.data import cache as ucache

    data = write_demo(tmp_path / "d", train=16, val=8, size=64)
    cache = 24 * 32 * 32 * 3
    opts = Options(data=data, workers=2, cpus=4, batch=4, imgsz=32, cache="ram")
    plan = {"workers": 2, "val_workers": 4, "prefetch": 2, "start_method": "forkserver"}
    monkeypatch.setattr(ucache, "shares_ram_cache", lambda: True)
    row = doctor_system.ram_cache_row(opts, plan, free=2 * cache)
    assert row.status == OK and row.data["cache_bytes"] == cache and "shared with the DataLoader workers" in row.found
    for free, shares in ((2 * cache - 1, True), (10 * cache, False)):
        monkeypatch.setattr(ucache, "shares_ram_cache", lambda shares=shares: shares)
        row = doctor_system.ram_cache_row(opts, plan, free=free)
        assert row.status == WARN and "each of 2 workers would get a copy" in row.found
        assert all(fix in row.fix for fix in ("--shm-size=1g", "--ipc=host", "cache=disk", "--profile threads"))
    assert doctor_system.ram_cache_row(Options(data=data, workers=2, cache="disk"), plan, 0) is None
    assert doctor_system.ram_cache_row(opts, dict(plan, workers=0), 0) is None
    batches = {r.check: r for r in doctor_system.check_shm(Options(data=data, workers=2, cpus=4, batch=4, imgsz=32))}
    monkeypatch.setattr(ucache, "shares_ram_cache", lambda: True)
    rows = {r.check: r for r in doctor_system.check_shm(opts)}
    if rows["shm.cache"].status == OK:  # this machine's /dev/shm holds the cache twice
        assert rows["shm.size"].data["need"] == batches["shm.size"].data["need"] + 2 * cache
        assert "+ cache=ram" in rows["shm.size"].found


def test_low_open_file_limit_warns():
    rows = rows_by_check(doctor_system.check_shm(Options(workers=2, nofile=(256, 4096), cpus=4)))
    assert rows["shm.nofile"].status == WARN and "ulimit -n" in rows["shm.nofile"].fix


def test_sitecustomize_forcing_fork_is_named(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text("import multiprocessing\nmultiprocessing.set_start_method('fork')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    row = next(doctor_system.check_start_method(Options()))
    assert row.status == WARN and "sitecustomize.py" in row.found and "'fork'" in row.found


def test_clean_interpreter_start_method_ok():
    row = next(doctor_system.check_start_method(Options()))
    assert row.status == OK and "spawn" in row.found


def test_kernel_log_lines_that_matter(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[  1.0] usb 1-1: new device\n"
        "[ 99.1] workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times\n"
        "[120.5] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"
        "[121.0] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1\n"
    )
    row = next(doctor_system.check_kernel_log(Options(kernel_log=log)))
    assert row.status == WARN
    assert (
        "userptr" in row.data["counts"] and "GPU reset" in row.data["counts"] and "ring timeout" in row.data["counts"]
    )
    assert any("restore_userptr" in d for d in row.details) and not any("usb" in d for d in row.details)
    assert "spawn" in row.fix
    unreadable = next(doctor_system.check_kernel_log(Options(kernel_log=tmp_path / "missing")))
    assert unreadable.status == SKIP


def test_corrupt_image_bad_class_and_fifo_are_named(demo):
    root = demo.parent
    (root / "images/train/train_0000.png").write_bytes(b"not a png at all")
    with open(root / "labels/train/train_0001.txt", "a") as f:
        f.write("7 0.5 0.5 0.1 0.1\n")
    with open(root / "labels/train/train_0002.txt", "a") as f:
        f.write("0 0.5 0.5 1.7 0.1\n")
    rows = rows_by_check(doctor.diagnose(Options(data=demo, skip=frozenset(doctor.CHECKS) - {"data"})))
    train = rows["data.train"]
    assert train.status == WARN and train.data["usable"] == 5
    text = "\n".join(train.details)
    assert "train_0000.png" in text and "train_0001.txt:" in text and "class id 7" in text and "train_0002.txt" in text
    assert rows["data.val"].status == OK

    os.mkfifo(root / "images/val/stuck.jpg")  # Ultralytics would block on it forever
    started = time.monotonic()
    rows = rows_by_check(doctor.diagnose(Options(data=demo, skip=frozenset(doctor.CHECKS) - {"data"})))
    assert time.monotonic() - started < 30
    assert rows["data.val"].status == FAIL and "stuck.jpg" in "\n".join(rows["data.val"].details)
    assert "FIFO" in "\n".join(rows["data.val"].details)


def test_yaml_problems(tmp_path, demo):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    rows = rows_by_check(doctor.diagnose(Options(data=bad, skip=frozenset(doctor.CHECKS) - {"data", "loader"})))
    assert rows["data.yaml"].status == FAIL and "not valid YAML" in rows["data.yaml"].found
    assert rows["loader.single"].status == SKIP
    moved = tmp_path / "moved.yaml"
    moved.write_text(demo.read_text().replace("images/val", "images/nowhere"))
    rows = rows_by_check(doctor.diagnose(Options(data=moved, skip=frozenset(doctor.CHECKS) - {"data"})))
    assert rows["data.val"].status == FAIL and "images/nowhere" in rows["data.val"].found


def test_txt_image_lists_resolve_like_ultralytics(tmp_path, demo):
    root = demo.parent
    (root / "train.txt").write_text("\n".join(f"./images/train/train_{i:04d}.png" for i in range(3)) + "\n")
    yaml = tmp_path / "list.yaml"
    yaml.write_text(f"path: {root}\ntrain: train.txt\nval: [images/val]\nnames: [a, b, c]\n")
    spec = datasets.load_spec(yaml)
    files, missing = datasets.image_files(spec.splits["train"])
    assert len(files) == 3 and not missing
    assert datasets.label_path(files[0]).endswith("labels/train/train_0000.txt")


def test_amd_gpu_with_a_non_rocm_torch_is_blocking(tmp_path):
    from rocm_yolo.gpu.torch_build import torch_build

    kind = doctor_system.torch_kind(torch_build())
    if kind == "hip":
        pytest.skip("this torch is a ROCm build")
    opts = Options(root=fake_root(tmp_path), skip=frozenset({"shm", "start", "data", "loader", "kernel"}))
    rows = rows_by_check(checks.run_all(opts))
    fix = rows["versions.torch"].fix
    assert rows["versions.torch"].status == FAIL
    assert "'torch[device-gfx1010]' 'torchvision[device-gfx1010]' --index-url https://stable.repo.amd.com/" in fix
    assert rows["gpu.torch_arch"].status == SKIP and rows["conv.selftest"].status == SKIP


def test_json_report_is_strict_json():
    rows = [doctor.Row("conv.selftest", "conv", WARN, "x", data={"results": {"native": {"max_err": float("nan")}}})]
    text = json.dumps(doctor.report_dict(rows, doctor.conclusion(rows), 0), allow_nan=False)
    assert json.loads(text)["rows"][0]["data"]["results"]["native"]["max_err"] is None


def test_an_ultralytics_outside_the_tested_range_is_a_warning(tmp_path, monkeypatch):
    from rocm_yolo.ultralytics_rules import compat

    ours = doctor_system._metadata_version("ultralytics")
    assert rows_by_check(doctor_system.check_versions(Options(root=tmp_path), []))["versions.ultralytics"].status == OK
    monkeypatch.setattr(doctor_system, "_metadata_version", lambda dist: "8.4.1" if dist == "ultralytics" else ours)
    row = rows_by_check(doctor_system.check_versions(Options(root=tmp_path), []))["versions.ultralytics"]
    assert row.status == WARN and f"outside the tested range {compat.SUPPORTED_ULTRALYTICS}" in row.found
    assert row.fix == f"pip install 'ultralytics{compat.SUPPORTED_ULTRALYTICS}'"


def test_a_torch_older_than_the_tested_ones_is_a_warning_with_the_install_line(tmp_path, monkeypatch):
    from rocm_yolo.gpu.torch_build import torch_build
    from rocm_yolo.ultralytics_rules.versions import TESTED_TORCH

    build = torch_build()
    if doctor_system.torch_kind(build) == "hip":
        pytest.skip("this torch is a ROCm build")
    assert rows_by_check(doctor_system.check_versions(Options(root=tmp_path), []))["versions.torch"].status == OK
    monkeypatch.setattr(doctor_system, "torch_build", lambda: dict(build, torch="2.10.0"))
    row = rows_by_check(doctor_system.check_versions(Options(root=tmp_path), []))["versions.torch"]
    assert row.status == WARN and f"older than the torch versions tested ({TESTED_TORCH}" in row.found
    assert "pip install" in row.fix and row.data["tested"] == TESTED_TORCH


ONLY_DATA = frozenset(doctor.CHECKS) - {"data"}


def _break(task: str, data: Path) -> tuple[str, str]:
    """Make one malformed label line (or image); return (the words the doctor must say, expected status)."""
    if task == "classify":
        (data / "train" / "circle" / "train_001.png").write_bytes(b"not an image")
        shutil.copy(data / "train" / "square" / "train_000.png", data / "train" / "loose.png")
        return "train_001.png: does not decode", WARN
    labels = data.parent / "labels" / "train"
    if task == "segment":
        (labels / "train_004.txt").write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n1 0.2 0.2 0.3 0.2 0.3 0.3 0.2 0.3\n0 0.5\n")
        return "train_004.txt:3: 2 numbers, expected a polygon", WARN
    if task == "pose":
        with open(labels / "train_005.txt", "a") as f:
            f.write("1 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2\n")  # 2 keypoints where kpt_shape says 3
        return "train_005.txt:2: 11 numbers, expected 14", WARN
    (labels / "train_006.txt").write_text("1 0.1 0.1 0.9 0.1 0.9 0.9 0.1 1.7\n")  # obb: a corner off the image
    return "train_006.txt:1: coordinates outside 0..1 (up to 1.7)", WARN


@pytest.mark.parametrize("task", TASKS)
def test_doctor_names_the_malformed_line_of_each_task(task_data, tmp_path, task):
    data = copy_task(task_data, task, tmp_path)
    clean = {r.check: r for r in doctor.diagnose(Options(data=data, skip=ONLY_DATA))}
    assert clean["data.train"].status == OK and clean["data.val"].status == OK, clean["data.train"].details
    words, status = _break(task, data)
    rows = {r.check: r for r in doctor.diagnose(Options(data=data, task=task, skip=ONLY_DATA))}
    train = rows["data.train"]
    assert train.status == status and any(words in d for d in train.details), train.details
    if task == "classify":
        assert rows["data.folder"].status == OK and "2 classes (circle, square)" in rows["data.folder"].found
        assert any("loose.png" in d for d in train.details) and train.data["classes"] == {"circle": 8, "square": 8}
    else:
        assert f"checked as {task} labels" in rows["data.yaml"].found


def test_doctor_box_lines_block_segment_and_obb(task_data, tmp_path):
    """Ultralytics stops a segment or obb run on a box-only label file; for detection it is fine."""
    data = copy_task(task_data, "segment", tmp_path)
    (data.parent / "labels/train/train_002.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    for task, status in (("segment", FAIL), ("obb", FAIL), ("detect", OK)):
        train = {r.check: r for r in doctor.diagnose(Options(data=data, task=task, skip=ONLY_DATA))}["data.train"]
        assert train.status == status, (task, train.details)
        if status == FAIL:
            assert "refuses the data set" in train.details[0] and "train_002.txt:1: a box" in train.details[1]
            assert "give every object" in train.fix


def test_doctor_command_on_a_classification_folder(task_data, tmp_path):
    data = copy_task(task_data, "classify", tmp_path)
    skip = ",".join(c for c in doctor.CHECKS if c != "data")
    proc = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "doctor", str(data), "--json", "--skip", skip],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stdout)
    rows = {r["check"]: r for r in report["rows"]}
    assert proc.returncode == 0, proc.stderr
    assert rows["data.folder"]["data"]["names"] == {"0": "circle", "1": "square"}
    assert rows["data.train"]["found"] == "16 images in 2 class folders" and rows["data.val"]["status"] == OK
    wrong = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "doctor", str(data), "--task", "pose", "--skip", skip],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wrong.returncode == 1 and "is a directory: that is classification data" in wrong.stdout


def test_a_rocm_torch_without_the_cards_code_gets_the_install_line_for_the_card():
    row = gpu_checks._torch_arch_row("gfx1010", "gfx1010", ["gfx1030", "gfx1100"])  # pytorch.org's ROCm wheels
    assert row.status == FAIL and "has no gfx1010 code" in row.found
    assert row.fix == (
        "install AMD's wheels for gfx1010: pip install 'torch[device-gfx1010]' 'torchvision[device-gfx1010]' "
        "--index-url https://stable.repo.amd.com/rocm/whl-next/"
    )
    apu = gpu_checks._torch_arch_row("gfx90c", "gfx90c", ["gfx900", "gfx906"])  # no wheels: a build, or the override
    assert apu.fix.startswith("AMD publishes no torch wheels for gfx90c")
    assert apu.fix.endswith("with this torch, try HSA_OVERRIDE_GFX_VERSION=9.0.0 (runs it as gfx900)")
    assert gpu_checks._torch_arch_row("gfx1010", "gfx1010", ["gfx1010", "gfx1030"]).status == OK


def _two_gpu_root(tmp_path, second: int, cmdline: str, renders=(128,)) -> Path:
    root = tmp_path / "root"
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    for node, version, minor in ((0, 0, None), (1, 100100, 128), (2, second, 129)):
        (nodes / str(node)).mkdir(parents=True)
        props = f"gfx_target_version {version}\n" + (f"drm_render_minor {minor}\n" if minor else "")
        (nodes / str(node) / "properties").write_text(props)
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text(cmdline + "\n")
    (root / "dev/dri").mkdir(parents=True)
    for minor in renders:
        (root / f"dev/dri/renderD{minor}").write_text("")
    return root


def test_two_gpus_of_mixed_architectures_without_iommu_pt(tmp_path):
    from rocm_yolo.doctor import multigpu

    opts = Options(root=_two_gpu_root(tmp_path, 100300, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet"))
    gpus, _ = gpu_checks.detect_gpus(opts)
    rows = rows_by_check(multigpu.check_multi_gpu(opts, gpus))
    assert rows["gpu.multi"].status == WARN and "mixed architectures gfx1010, gfx1030" in rows["gpu.multi"].found
    assert "'torch[device-gfx1010,device-gfx1030]'" in rows["gpu.multi"].fix
    assert (
        rows["gpu.multi_devices"].status == FAIL
        and "GPU 1 (gfx1030): /dev/dri/renderD129" in rows["gpu.multi_devices"].found
    )
    assert rows["gpu.rccl"].status == WARN and "iommu=pt is not on the kernel command line" in rows["gpu.rccl"].found
    assert "ROCm/rccl#1129" in rows["gpu.rccl"].fix


def test_two_alike_gpus_with_iommu_pt_and_one_gpu_gets_no_multi_gpu_rows(tmp_path):
    from rocm_yolo.doctor import multigpu

    opts = Options(root=_two_gpu_root(tmp_path, 100100, "root=/dev/sda1 iommu=pt", renders=(128, 129)))
    gpus, _ = gpu_checks.detect_gpus(opts)
    rows = rows_by_check(multigpu.check_multi_gpu(opts, gpus))
    assert rows["gpu.multi"].status == OK and "2 GPUs, all gfx1010" in rows["gpu.multi"].found
    assert rows["gpu.rccl"].status == OK and "gpu.multi_devices" not in rows
    assert list(multigpu.check_multi_gpu(opts, gpus[:1])) == []


def test_the_hsa_override_is_checked_against_every_gpu(tmp_path):
    """gfx1010 + gfx1030 with HSA_OVERRIDE_GFX_VERSION=10.3.0: it fits the gfx1030, and runs the gfx1010 as a
    gfx1030 (reported to crash): the row names GPU 0 and the per-GPU variable ROCm 6.2+ reads (ROCm#5069)."""
    opts = Options(root=_two_gpu_root(tmp_path, 100300, "root=/dev/sda1 iommu=pt"))
    gpus, _ = gpu_checks.detect_gpus(opts)
    assert [g.arch for g in gpus] == ["gfx1010", "gfx1030"]
    row = hsa_override.override_rows(gpus, {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert row.status == WARN and row.found.startswith("GPU 0 (gfx1010): ") and "reported to crash" in row.found
    assert "HSA_OVERRIDE_GFX_VERSION_0=" in row.fix and "ROCm#5069" in row.fix
    per_gpu = {"HSA_OVERRIDE_GFX_VERSION_1": "10.3.0"}  # only the gfx1030 gets it
    assert hsa_override.override_rows(gpus, per_gpu).status == OK
    assert hsa_override.override_rows(gpus[:1], {"HSA_OVERRIDE_GFX_VERSION": "10.1.0"}).status == OK


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1"])
def test_the_doctors_timeout_must_be_a_finite_number_of_seconds(timeout):
    r = subprocess.run(
        [sys.executable, "-m", "rocm_yolo", "doctor", "--timeout", timeout], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "give a finite number of seconds > 0" in r.stderr and "Traceback" not in r.stderr


def test_a_timeout_too_short_for_importing_torch_is_not_torchs_fault():
    opts = Options(timeout=0.01, skip=frozenset(doctor.CHECKS) - {"versions"})
    rows = rows_by_check(doctor.diagnose(opts))
    assert rows["versions.torch"].status == WARN and "--timeout" in rows["versions.torch"].fix
    assert "reinstall" not in rows["versions.torch"].fix
