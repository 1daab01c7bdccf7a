"""rocm-yolo doctor: fake device trees, real data sets, a real multi-process hang.

Nothing here mocks Ultralytics or process machinery: the DataLoader checks build
Ultralytics' own dataset in real subprocesses, and leftover processes are counted with psutil.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rocm_yolo import doctor, doctor_checks, doctor_data
from rocm_yolo.doctor import FAIL, OK, SKIP, WARN, Options

ALL_BUT = lambda *keep: ",".join(c for c in doctor.CHECKS if c not in keep)  # noqa: E731


def rows_by_check(rows):
    return {r.check: r for r in rows}


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def demo(tmp_path):
    from rocm_yolo.demo import write_demo

    return write_demo(tmp_path / "d", train=8, val=4, size=64)


# --------------------------------------------------------------------------- usage and exit codes


def test_missing_data_file_is_a_one_line_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rocm_yolo.doctor", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == doctor.EXIT_USAGE
    assert proc.stderr.strip().count("\n") == 0 and "data file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["--skip", "bogus"], "unknown check"),
    (["--workers", "-1"], "--workers"),
    (["--profile", "turbo"], "unknown profile"),
])
def test_bad_options_exit_2(argv, words, capsys):
    assert doctor.main(argv) == doctor.EXIT_USAGE
    assert words in capsys.readouterr().err


def test_conclusion_and_exit_code():
    rows = [doctor.Row("a", "a", OK, "fine"), doctor.Row("b", "b", WARN, "hmm")]
    assert doctor.exit_code(rows) == 0 and "Nothing blocks training" in doctor.conclusion(rows)
    rows.append(doctor.Row("c", "DataLoader", FAIL, "hang", data={"verdict": "use --profile single"}))
    assert doctor.exit_code(rows) == 1 and doctor.conclusion(rows).endswith("use --profile single")
    text = doctor.format_report(rows)
    assert "✓ a" in text and "⚠ b" in text and "✗ DataLoader" in text


# --------------------------------------------------------------------------- GPU, fake trees


@pytest.mark.parametrize("arch, value, status, words", [
    ("gfx1010", None, OK, "not set"),
    ("gfx1010", "10.3.0", WARN, "RX 5700"),
    ("gfx1010", "10.1.0", OK, "matches"),
    ("gfx1012", "10.1.0", OK, "fits"),
    ("gfx1031", "10.3.0", OK, "fits"),
    ("gfx1030", "11.0.0", FAIL, "another generation"),
    ("gfx1010", "ten", FAIL, "X.Y.Z"),
    (None, "10.3.0", WARN, "no AMD GPU"),
])
def test_hsa_override_against_arch(arch, value, status, words):
    row = doctor_checks.override_row(arch, value)
    assert row.status == status and words in row.found
    if value == "10.3.0" and arch == "gfx1010":
        assert "10.1.0" in row.fix


def fake_root(tmp_path, *, members="", devices=True, gfx=100100) -> Path:
    root = tmp_path / "root"
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 8\ngfx_target_version 0\n")
    (nodes / "1").mkdir()
    (nodes / "1/properties").write_text(f"gfx_target_version {gfx}\nvendor_id 4098\ndevice_id 29471\ndrm_render_minor 128\n")
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
    gpus, why = doctor_checks.detect_gpus(opts)
    assert [g.arch for g in gpus] == ["gfx1010"]
    rows = rows_by_check(doctor_checks.check_gpu(opts, gpus, why))
    assert rows["gpu.arch"].status == OK and "gfx1010" in rows["gpu.arch"].found
    assert rows["gpu.devices"].status == FAIL and "/dev/kfd" in rows["gpu.devices"].found
    assert rows["gpu.groups"].status == FAIL
    assert "sudo usermod -aG render,video $USER" in rows["gpu.groups"].fix and "log out" in rows["gpu.groups"].fix


@needs_root
def test_group_added_but_session_not_refreshed(tmp_path):
    opts = Options(root=fake_root(tmp_path, members="alice"), uid=1000, user="alice", groups=frozenset({"alice"}))
    rows = rows_by_check(doctor_checks.check_gpu(opts, *doctor_checks.detect_gpus(opts)))
    assert rows["gpu.groups"].status == FAIL and "log out" in rows["gpu.groups"].fix


@needs_root
def test_member_of_render_and_video_is_fine(tmp_path):
    opts = Options(root=fake_root(tmp_path, members="alice"), uid=1000, user="alice",
                   groups=frozenset({"alice", "render", "video"}))
    rows = rows_by_check(doctor_checks.check_gpu(opts, *doctor_checks.detect_gpus(opts)))
    assert rows["gpu.devices"].status == OK and rows["gpu.groups"].status == OK


def test_missing_device_files_in_a_container(tmp_path):
    opts = Options(root=fake_root(tmp_path, devices=False), uid=0, user="root", groups=frozenset({"root"}))
    rows = rows_by_check(doctor_checks.check_gpu(opts, *doctor_checks.detect_gpus(opts)))
    assert rows["gpu.devices"].status == FAIL and "--device=/dev/kfd" in rows["gpu.devices"].fix


def test_no_gpu_rows_are_skipped_not_failed(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    opts = Options(root=root, skip=frozenset({"data", "loader", "kernel", "start", "shm"}))
    rows = list(doctor_checks.run_all(opts))
    by = rows_by_check(rows)
    assert by["gpu.arch"].status == SKIP and by["gpu.kernel"].status == SKIP and by["conv.selftest"].status == SKIP
    assert doctor.exit_code(rows) == 0 or by["versions.torch"].status == FAIL


# --------------------------------------------------------------------------- shm, start method, kernel log


def test_docker_default_shm_is_too_small():
    plan = {"workers": 8, "val_workers": 16, "prefetch": 4}
    need = doctor_checks.shm_need(8, 16, 4, 16, 640)
    assert need == 4 * (8 * 16 + 16 * 32) * 3 * 640 * 640
    row = doctor_checks.shm_row(64 * 2**20, 64 * 2**20, need, plan, "test")
    assert row.status == FAIL and "Docker's default" in row.found
    assert "--shm-size=8g" in row.fix and "--ipc=host" in row.fix
    assert doctor_checks.shm_row(32 * 2**30, 32 * 2**30, need, plan, "test").status == OK
    assert doctor_checks.shm_row(32 * 2**30, 2**20, need, plan, "test").status == WARN


def test_low_open_file_limit_warns():
    rows = rows_by_check(doctor_checks.check_shm(Options(workers=2, nofile=(256, 4096), cpus=4)))
    assert rows["shm.nofile"].status == WARN and "ulimit -n" in rows["shm.nofile"].fix


def test_sitecustomize_forcing_fork_is_named(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text("import multiprocessing\nmultiprocessing.set_start_method('fork')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    row = next(doctor_checks.check_start_method(Options()))
    assert row.status == WARN and "sitecustomize.py" in row.found and "'fork'" in row.found


def test_clean_interpreter_start_method_ok():
    row = next(doctor_checks.check_start_method(Options()))
    assert row.status == OK and "spawn" in row.found


def test_kernel_log_lines_that_matter(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[  1.0] usb 1-1: new device\n"
        "[ 99.1] workqueue: amdgpu_amdkfd_restore_userptr_worker [amdgpu] hogged CPU for >10000us 4 times\n"
        "[120.5] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!\n"
        "[121.0] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=1\n"
    )
    row = next(doctor_checks.check_kernel_log(Options(kernel_log=log)))
    assert row.status == WARN
    assert "userptr" in row.data["counts"] and "GPU reset" in row.data["counts"] and "ring timeout" in row.data["counts"]
    assert any("restore_userptr" in d for d in row.details) and not any("usb" in d for d in row.details)
    assert "spawn" in row.fix
    unreadable = next(doctor_checks.check_kernel_log(Options(kernel_log=tmp_path / "missing")))
    assert unreadable.status == SKIP


# --------------------------------------------------------------------------- bounded subprocesses


def test_run_bounded_kills_the_whole_tree(tmp_path):
    pids = tmp_path / "pids"
    code = ("import os, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
            "time.sleep(600)\n")
    before = descendants()
    outcome = doctor_checks.run_bounded([sys.executable, "-c", code], timeout=3)
    assert outcome.timed_out and outcome.returncode is None
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert descendants() <= before


# --------------------------------------------------------------------------- data sets


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
    spec = doctor_data.load_spec(yaml)
    files, missing = doctor_data.image_files(spec.splits["train"])
    assert len(files) == 3 and not missing
    assert doctor_data.label_path(files[0]).endswith("labels/train/train_0000.txt")


# --------------------------------------------------------------------------- DataLoader, for real


def _loader_skip():
    return ",".join(c for c in doctor.CHECKS if c not in ("loader",))


@pytest.mark.e2e
def test_healthy_loader_single_and_spawn(demo, capsys):
    before = descendants()
    code = doctor.main([str(demo), "--workers", "1", "--batch", "2", "--timeout", "60", "--json", "--skip", _loader_skip()])
    report = json.loads(capsys.readouterr().out)
    rows = {r["check"]: r for r in report["rows"]}
    assert code == 0 and report["exit_code"] == 0, report
    assert rows["loader.single"]["status"] == OK and rows["loader.multi"]["status"] == OK
    assert rows["loader.startup"]["status"] == OK
    assert descendants() <= before


def _fault_hook_available() -> bool:
    return (importlib.util.find_spec("rocm_yolo.faults") is not None
            and importlib.util.find_spec("rocm_yolo.patches.dataloader") is not None)


@pytest.mark.e2e
@pytest.mark.skipif(not _fault_hook_available(), reason="needs the DataLoader patch's ROCM_YOLO_FAULT=worker-hang hook")
def test_multiprocess_hang_is_reported_and_nothing_is_left(demo, capsys, monkeypatch):
    monkeypatch.setenv("ROCM_YOLO_FAULT", "worker-hang")
    before = descendants()
    started = time.monotonic()
    code = doctor.main([str(demo), "--workers", "2", "--batch", "2", "--timeout", "20", "--json", "--skip", _loader_skip()])
    report = json.loads(capsys.readouterr().out)
    rows = {r["check"]: r for r in report["rows"]}
    assert code == doctor.EXIT_PROBLEMS == report["exit_code"]
    assert rows["loader.single"]["status"] == OK
    assert rows["loader.multi"]["status"] == FAIL and "hang" in rows["loader.multi"]["found"]
    assert report["conclusion"].endswith("single-process works, multi-process hangs: use --profile single")
    assert time.monotonic() - started < 120
    time.sleep(0.2)
    assert descendants() <= before
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "probe_main" in " ".join(p.info["cmdline"] or [])]
    assert not leftovers


def test_amd_gpu_with_a_non_rocm_torch_is_blocking(tmp_path):
    from rocm_yolo.rocm import torch_build

    kind = doctor_checks.torch_kind(torch_build())
    if kind == "hip":
        pytest.skip("this torch is a ROCm build")
    opts = Options(root=fake_root(tmp_path), skip=frozenset({"shm", "start", "data", "loader", "kernel"}))
    rows = rows_by_check(doctor_checks.run_all(opts))
    assert rows["versions.torch"].status == FAIL and "rocm" in rows["versions.torch"].fix
    assert rows["gpu.torch_arch"].status == SKIP and rows["conv.selftest"].status == SKIP


def test_json_report_is_strict_json():
    rows = [doctor.Row("conv.selftest", "conv", WARN, "x", data={"results": {"native": {"max_err": float("nan")}}})]
    text = json.dumps(doctor.report_dict(rows, doctor.conclusion(rows), 0), allow_nan=False)
    assert json.loads(text)["rows"][0]["data"]["results"]["native"]["max_err"] is None


def test_an_ultralytics_outside_the_tested_range_is_a_warning(tmp_path, monkeypatch):
    from rocm_yolo import compat

    ours = doctor_checks._metadata_version("ultralytics")
    assert rows_by_check(doctor_checks.check_versions(Options(root=tmp_path), []))["versions.ultralytics"].status == OK
    monkeypatch.setattr(doctor_checks, "_metadata_version", lambda dist: "8.4.1" if dist == "ultralytics" else ours)
    row = rows_by_check(doctor_checks.check_versions(Options(root=tmp_path), []))["versions.ultralytics"]
    assert row.status == WARN and f"outside the tested range {compat.SUPPORTED_ULTRALYTICS}" in row.found
    assert row.fix == f"pip install 'ultralytics{compat.SUPPORTED_ULTRALYTICS}'"
