"""Every Ultralytics task trains under rocm-yolo: classify, segment, pose and obb, end to end on the CPU.

One session fixture trains all four tasks at once (four independent real CLI runs, each in
its own directory, so the waits of one overlap the work of the others). Each run trains its
first epoch with a spawn DataLoader worker, is then broken for real, and ends on the
``single`` profile, resumed from its ``last.pt``:

- classify: a DataLoader worker blocks forever in epoch 2; the watchdog dumps the stacks,
  kills the tree and resumes on ``--fallback single`` by itself;
- pose: the trainer crashes in epoch 2; the watchdog resumes on ``--fallback single``;
- segment, obb: the trainer crashes in epoch 2 with no restarts allowed; the user resumes
  with ``rocm-yolo train --resume [LAST_PT] --profile single`` (segment: the bare form,
  which finds the newest run of any task).

The data checks of the CLI and the doctor run on tiny per-task data sets with one
malformed line (or image) each, and must name the file and the line.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Cli, rocm_lines
from rocm_yolo import checkpoints, datasets, doctor, launch, ownership, tasks
from rocm_yolo.doctor import FAIL, OK, WARN, Options
from rocm_yolo.errors import UsageError
from rocm_yolo.log import read_events
from rocm_yolo.paths import RunPaths
from taskdata import TASKS, write_task_data

e2e = pytest.mark.e2e
STALL = 10
MODELS = {"classify": "yolo26n-cls.yaml", "segment": "yolo26n-seg.yaml", "pose": "yolo26n-pose.yaml", "obb": "yolo26n-obb.yaml"}
# 2 epochs, 1 spawn worker, validation only at the end (Ultralytics' val=False) to keep it cheap
RUN = ["--device", "cpu", "--imgsz", "32", "--batch", "4", "--workers", "1", "--epochs", "2", "plots=False", "val=False"]
ONLY_DATA = frozenset(doctor.CHECKS) - {"data"}


def _scenario(task: str, data: Path) -> list[tuple[list[str], dict]]:
    first = ["train", str(data), "--model", MODELS[task], *RUN]
    if task == "classify":  # prefetch 1: the worker must still have batches to load when the trigger appears
        return [([*first, "--stall-timeout", str(STALL), "--startup-grace", "180", "--fallback", "single",
                  "prefetch_factor=1"], {"ROCM_YOLO_FAULT": "worker-hang@2:1"})]
    if task == "pose":
        return [([*first, "--fallback", "single"], {"ROCM_YOLO_FAULT": "crash@2:1"})]
    resume = ["--resume"] if task == "segment" else ["--resume", f"runs/{task}/train/weights/last.pt"]
    return [([*first, "--max-restarts", "0"], {"ROCM_YOLO_FAULT": "crash@2:1"}),
            (["train", *resume, "--profile", "single"], {})]


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("taskdata")
    return {t: write_task_data(root / t, t, train=16 if t == "classify" else 8) for t in TASKS}


@pytest.fixture(scope="session")
def task_runs(tmp_path_factory, task_data) -> dict[str, dict]:
    """All four tasks' scenarios, run concurrently; per task: its Cli, run dir, steps and wall time."""
    root = tmp_path_factory.mktemp("taskruns")
    results: dict[str, dict] = {}

    def play(task: str) -> None:
        cwd = root / task
        cwd.mkdir()
        cli = Cli(cwd)
        steps, started, error = [], time.monotonic(), None
        try:
            for args, env in _scenario(task, task_data[task]):
                steps.append(cli.run(*args, env=env, timeout=420))
        except BaseException as e:  # noqa: BLE001 - reported by the tests, not lost in this thread
            error = e
        finally:
            results[task] = {"cli": cli, "run": cwd / "runs" / task / "train", "steps": steps, "error": error,
                             "seconds": time.monotonic() - started, "leftovers": cli.leftovers()}
            cli.kill_all()

    threads = [threading.Thread(target=play, args=(t,)) for t in TASKS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("\ntask scenario wall times: " + ", ".join(f"{t} {r['seconds']:.1f} s" for t, r in results.items()))
    return results


def events(run: Path, kind: str) -> list[dict]:
    return [e for e in read_events(RunPaths(run).events) if e["event"] == kind]


def results_csv(run: Path) -> list[dict]:
    with open(run / "results.csv") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- every task, end to end


@e2e
@pytest.mark.parametrize("task", TASKS)
def test_task_trains_with_spawn_workers_and_resumes_on_single(task_runs, task):
    r = task_runs[task]
    run, steps = r["run"], r["steps"]
    assert r["error"] is None, r["error"]
    out = "\n".join(s.stdout for s in steps)
    assert steps and steps[-1].returncode == 0, out[-4000:]
    assert run.is_dir(), f"Ultralytics' layout runs/{task}/NAME"
    rows = results_csv(run)
    assert [int(float(x["epoch"])) for x in rows] == [1, 2], "one continuous results.csv across the resume"
    metric = {"classify": "metrics/accuracy_top1", "segment": "metrics/mAP50(M)", "pose": "metrics/mAP50(P)",
              "obb": "metrics/mAP50(B)"}[task]
    assert metric in rows[0], f"{task} metrics expected in results.csv: {list(rows[0])}"
    # epoch 1: the DataLoader patch gave the train loader one worker, made by spawn (or the forkserver)
    [loaders] = events(run, "loaders")[:1]
    train_loader = next(x for x in loaders["loaders"] if x["role"] == "train")
    assert train_loader["workers"] == 1 and train_loader["start_method"] in ("spawn", "forkserver")
    made = [json.loads(x) for x in RunPaths(run).workers.read_text().splitlines()]
    assert made and {w["start_method"] for w in made} <= {"spawn", "forkserver"} and {w["role"] for w in made} == {"train"}
    # epoch 2: resumed from last.pt on the single profile, no worker processes
    [resumed] = events(run, "resume")
    assert resumed["epoch"] == 2 and "workers 1 -> 0" in " ".join(resumed["changed"])
    assert resumed["checkpoint"].endswith(f"runs/{task}/train/weights/last.pt")
    assert "from epoch 2/2 with profile 'single'" in out and "loaders: workers=0 (in the main process)" in out
    assert checkpoints.verify(run / "weights" / "best.pt") is None
    assert tasks.checkpoint_task(run / "weights" / "best.pt") == task  # what Ultralytics stored in it
    assert r["leftovers"] == []
    status = subprocess.run([sys.executable, "-m", "rocm_yolo", "status", str(run)], capture_output=True, text=True,
                            timeout=60)
    assert status.returncode == 0 and "state:     finished" in status.stdout and "epoch 2/2" in status.stdout


@e2e
def test_classification_worker_hang_is_recovered_by_the_watchdog(task_runs, task_data):
    r = task_runs["classify"]
    run, [step] = r["run"], r["steps"]
    text = "\n".join(rocm_lines(step.stdout))
    assert "data: classification, 2 classes (circle, square)" in text
    fired = RunPaths(run).fault_fired("worker-hang").stat().st_mtime
    [hang] = events(run, "hang")
    assert hang["epoch"] == 2 and hang["phase"] == "train" and hang["time"] - fired <= STALL + 10
    [restart] = events(run, "restart")
    assert restart["profile"] == "single" and restart["resume"].endswith("weights/last.pt")
    stacks = (run / "hang-1-stacks.txt").read_text()
    worker_part = stacks[stacks.index("(worker,"):]
    assert "block_forever" in worker_part and "__getitem__" in worker_part  # the worker stuck in the data set
    assert "_try_get_data" in stacks[: stacks.index("(worker,")]  # the trainer waiting for its batch
    assert "restart 1/3 with profile 'single'" in text and "1 restart(s)" in step.stdout


@e2e
def test_user_resume_of_other_tasks_on_single(task_runs):
    for task in ("segment", "obb"):
        first, second = task_runs[task]["steps"]
        assert first.returncode == 1 and "failed after 0 restart(s)" in first.stdout, first.stdout[-3000:]
        assert (task_runs[task]["run"] / "crash-1.txt").is_file()
        text = "\n".join(rocm_lines(second.stdout))
        assert "resume changes the profile: fast -> single" in text and "changed: workers 1 -> 0" in text
        assert f"runs/{task}/train/weights/last.pt" in text  # segment's bare --resume found it among all tasks


@e2e
def test_renamed_classification_checkpoint_keeps_its_task(task_runs, task_data, tmp_path, monkeypatch):
    """A checkpoint named like no task (flowers.pt) still trains a classifier, into runs/classify."""
    renamed = tmp_path / "flowers.pt"
    shutil.copy(task_runs["classify"]["run"] / "weights" / "best.pt", renamed)
    assert tasks.task_of_name(renamed) == "detect" and tasks.task_for_model(renamed) == "classify"
    monkeypatch.chdir(tmp_path)
    spec = launch.make_spec(str(task_data["classify"]), model=str(renamed), epochs=1)
    try:
        assert Path(spec.run_dir) == tmp_path / "runs" / "classify" / "train"
        assert spec.train_args["data"] == str(task_data["classify"].resolve())
    finally:
        ownership.release(spec.run_dir)


# --------------------------------------------------------------------------- the CLI's data check


def test_data_that_does_not_fit_the_model_is_a_one_line_usage_error(task_data, tmp_path):
    cli = Cli(tmp_path)
    r = cli.run("train", str(task_data["classify"]), "--model", "yolo26n-seg.yaml", timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stdout
    [line] = [x for x in r.stdout.splitlines() if x.strip()]
    assert "is a directory: a segment model trains on a dataset YAML" in line and "yolo26n-cls" in line
    assert not (tmp_path / "runs" / "segment" / "train").exists()
    with pytest.raises(UsageError, match="a classification model trains on a directory of class folders"):
        launch.make_spec(str(task_data["segment"]), model="yolo26n-cls.yaml", project=str(tmp_path / "p"))
    with pytest.raises(UsageError, match="'demo' is a detection data set"):
        launch.make_spec("demo", model="yolo26n-pose.yaml", project=str(tmp_path / "p"))


def _copy(task_data, task: str, tmp_path: Path) -> Path:
    """A private copy of ``task``'s data (the shared one trains concurrently); its YAML or directory."""
    src = task_data[task] if task == "classify" else task_data[task].parent
    dst = tmp_path / task
    shutil.copytree(src, dst)
    if task == "classify":
        return dst
    yaml = dst / task_data[task].name
    yaml.write_text(yaml.read_text().replace(str(src), str(dst)))
    return yaml


def test_cli_refuses_labels_ultralytics_would_refuse(task_data, tmp_path):
    pose = _copy(task_data, "pose", tmp_path)
    pose.write_text(pose.read_text().replace("kpt_shape: [3, 3]", "kpt_shape: [3, 2]"))  # labels have 3 values each
    with pytest.raises(UsageError, match=r"train_000\.txt:1: 14 numbers, expected 11 .*kpt_shape \[3, 2\]"):
        launch.make_spec(str(pose), model="yolo26n-pose.yaml", project=str(tmp_path / "p"))
    obb = _copy(task_data, "obb", tmp_path)
    (obb.parent / "labels/val/val_002.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(UsageError, match=r"val_002\.txt:1: a box .* where obb needs 9"):
        launch.make_spec(str(obb), model="yolo26n-obb.yaml", project=str(tmp_path / "p"))
    seg = _copy(task_data, "segment", tmp_path)
    with open(seg.parent / "labels/train/train_003.txt", "a") as f:
        f.write("1 0.1 0.1 0.5 0.1 0.5\n")
    spec = launch.make_spec(str(seg), model="yolo26n-seg.yaml", project=str(tmp_path / "p"))
    ownership.release(spec.run_dir)
    [note] = [n for n in spec.notes if n.startswith("data:")]
    assert "1 of the first 8 train label files" in note and "train_003.txt:2: 6 numbers" in note


# --------------------------------------------------------------------------- the doctor, one malformed label per task


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
    data = _copy(task_data, task, tmp_path)
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
    data = _copy(task_data, "segment", tmp_path)
    (data.parent / "labels/train/train_002.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    for task, status in (("segment", FAIL), ("obb", FAIL), ("detect", OK)):
        train = {r.check: r for r in doctor.diagnose(Options(data=data, task=task, skip=ONLY_DATA))}["data.train"]
        assert train.status == status, (task, train.details)
        if status == FAIL:
            assert "refuses the data set" in train.details[0] and "train_002.txt:1: a box" in train.details[1]
            assert "give every object" in train.fix


def test_doctor_command_on_a_classification_folder(task_data, tmp_path):
    data = _copy(task_data, "classify", tmp_path)
    skip = ",".join(c for c in doctor.CHECKS if c != "data")
    proc = subprocess.run([sys.executable, "-m", "rocm_yolo", "doctor", str(data), "--json", "--skip", skip],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    rows = {r["check"]: r for r in report["rows"]}
    assert proc.returncode == 0, proc.stderr
    assert rows["data.folder"]["data"]["names"] == {"0": "circle", "1": "square"}
    assert rows["data.train"]["found"] == "16 images in 2 class folders" and rows["data.val"]["status"] == OK
    wrong = subprocess.run([sys.executable, "-m", "rocm_yolo", "doctor", str(data), "--task", "pose", "--skip", skip],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "is a directory: that is classification data" in wrong.stdout


# --------------------------------------------------------------------------- tasks and label lines, unit level


def test_task_of_a_model_as_ultralytics_decides(tmp_path):
    assert [tasks.task_for_model(m) for m in ("yolo26n-cls.yaml", "yolo26n-seg.pt", "yolo26n-pose.yaml",
                                              "yolo26s-obb.pt", "yolo26n.pt", "yolo11n.yaml")] == \
        ["classify", "segment", "pose", "obb", "detect", "detect"]
    assert tasks.task_for_model("runs/pose/train/weights/best.pt") == "pose"  # not on disk: its path says pose
    custom = tmp_path / "mine.yaml"
    custom.write_text("nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\nhead:\n  - [-1, 1, Classify, [nc]]\n")
    assert tasks.task_for_model(custom) == "classify"
    broken = tmp_path / "broken-seg.pt"
    broken.write_bytes(b"PK\x03\x04 not a zip")
    assert tasks.task_for_model(broken) == "segment"  # unreadable: the name decides


@pytest.mark.parametrize("task, kpt, line, words", [
    ("detect", None, "0 0.5 0.5 0.2 0.2", None),
    ("detect", None, "0 0.1 0.1 0.5 0.1 0.5 0.5", None),  # a polygon: Ultralytics takes its box
    ("detect", None, "0 0.5 0.5 0.2", "4 numbers, expected 5"),
    ("detect", None, "2 0.5 0.5 0.2 0.2", "class id 2 out of range"),
    ("detect", None, "0.5 0.5 0.5 0.2 0.2", "not a whole number"),
    ("detect", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2 0.6 0.6 2", None),  # pose labels: the box is kept
    ("segment", None, "0 0.1 0.1 0.5 0.1 0.5 0.5 0.1", "8 numbers, expected a polygon"),
    ("segment", None, "0 0.1 0.1 0.5 0.1 0.5 -0.5", "negative values"),
    ("pose", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2 0.6 0.6 2", None),
    ("pose", [3, 2], "0 0.5 0.5 0.2 0.2 0.5 0.4 0.4 0.6 1.5 0.6", "outside 0..1 (up to 1.5)"),
    ("pose", [3, 3], "0 0.5 0.5 0.2 0.2 0.5 0.4 2 0.4 0.6 2", "11 numbers, expected 14"),
    ("obb", None, "0 0.1 0.1 0.9 0.1 0.9 0.9 0.1 0.9", None),
    ("obb", None, "0 0.5 0.5 0.2 0.2", "a box (class x y w h) where obb needs 9"),
    ("obb", None, "0 0.1 0.1 0.9 0.1 0.9 0.9 nan 0.9", "not finite"),
])
def test_label_lines_per_task(tmp_path, task, kpt, line, words):
    path = tmp_path / "a.txt"
    path.write_text("\ufeff\n" + line + "\n", encoding="utf-8")  # a BOM and a blank line: Ultralytics ignores both
    problem = datasets.check_label(str(path), 2, datasets.label_format(task, kpt))
    if words is None:
        assert problem is None
    else:
        assert problem is not None and f"{path}:2: " in problem[1] and words in problem[1], problem


def test_mixed_box_and_polygon_lines_are_named(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("0 0.1 0.1 0.5 0.1 0.5 0.5\n0 0.5 0.5 0.2 0.2\n")
    assert datasets.check_label(str(path), 1, datasets.label_format("detect")) == \
        ("badlabel", f"{path}:2: mixes box and polygon lines (Ultralytics skips the image)")
    with pytest.raises(datasets.DataError, match="kpt_shape"):
        datasets.label_format("pose", [17, 4])


@pytest.mark.parametrize("where", ["YOLO_CONFIG_DIR", "XDG_CONFIG_HOME"])
def test_datasets_dir_is_read_from_the_settings_file_ultralytics_uses(tmp_path, where):
    """Relative data set roots resolve against Ultralytics' datasets_dir: read from its own settings file."""
    env = {k: v for k, v in os.environ.items() if k not in ("YOLO_CONFIG_DIR", "XDG_CONFIG_HOME")}
    env[where] = str(tmp_path / "config")
    (tmp_path / "config").mkdir()  # as a user's config directory is (else older Ultralytics fall back to /tmp)
    code = "from ultralytics.utils import SETTINGS, SETTINGS_FILE; print(SETTINGS_FILE); print(SETTINGS['datasets_dir'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    file, default = out.stdout.strip().splitlines()[-2:]
    assert datasets.settings_files(env)[0] == Path(file) and Path(file).is_relative_to(tmp_path)
    assert datasets.datasets_dir(env) == Path(default)  # the default Ultralytics wrote on its first import
    settings = json.loads(Path(file).read_text())
    Path(file).write_text(json.dumps({**settings, "datasets_dir": str(tmp_path / "mine")}))
    assert datasets.datasets_dir(env) == tmp_path / "mine"
