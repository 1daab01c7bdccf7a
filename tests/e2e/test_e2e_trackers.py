"""End to end: the attempts of one run are one MLflow run and one W&B run (offline), restarts recorded on it.

One run, shared by the tests: the trainer SIGKILLed at epoch 2 (a death without evidence: the
watchdog restarts on the ladder's next profile, 'safe', with fewer workers), then SIGKILLed again
at epoch 3 with no restart left (exit 1: the MLflow run is left RUNNING), then ``--resume``,
which trains epoch 3 and ends the run FINISHED.
Ultralytics skips its MLflow and W&B callbacks under pytest (``PYTEST_CURRENT_TEST``), so
the runs here are started without it, with their own Ultralytics settings (mlflow and wandb
on), MLflow's local file store and W&B offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TINY, Cli
from rocm_yolo.run.paths import RunPaths

pytestmark = pytest.mark.e2e

mlflow = pytest.importorskip("mlflow")  # the test extra installs mlflow-skinny
try:
    from wandb.proto import wandb_internal_pb2
except ImportError:  # W&B is checked when the test extra installed it
    wandb_internal_pb2 = None

EPOCHS = 3


def _settings(config_dir: Path) -> None:
    """Ultralytics' settings for these runs: MLflow and W&B on, no analytics."""
    code = "from ultralytics.utils import SETTINGS; SETTINGS.update(mlflow=True, wandb=True, sync=False)"
    env = {**os.environ, "YOLO_CONFIG_DIR": str(config_dir)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=120)


def _outside_pytest(cli: Cli, *args: str, env: dict | None = None):
    """``cli.run`` whose processes do not look like pytest's (Ultralytics then skips its tracker callbacks)."""
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        return cli.run(*args, env=env)
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved


def _runs(uri: str) -> list:
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, tiny_data):
    root = tmp_path_factory.mktemp("trackers")
    _settings(root / "config")
    uri = f"file:{root / 'mlruns'}"
    cli = Cli(root)
    cli.env = {
        "YOLO_CONFIG_DIR": str(root / "config"),
        "YOLO_OFFLINE": "true",
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **{f"WANDB_{d}_DIR": str(root / "wandb-home") for d in ("CONFIG", "CACHE", "DATA")},
    }
    run = root / "runs" / "detect" / "train"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this process's MLflow client too
        yield _train(cli, tiny_data, run, uri)


def _train(cli: Cli, tiny_data: Path, run: Path, uri: str) -> dict:
    try:
        failed = _outside_pytest(
            cli,
            *("train", str(tiny_data), "--epochs", str(EPOCHS), "--workers", "2", "--max-restarts", "1", *TINY),
            env={"ROCM_YOLO_FAULT": "kill@2:1,kill@3:1"},
        )
        between = [(r.info.run_id, r.info.status) for r in _runs(uri)]
        resumed = _outside_pytest(cli, "train", "--resume", str(RunPaths(run).last))
    finally:
        cli.kill_all()
    return {"run": run, "uri": uri, "failed": failed, "between": between, "resumed": resumed}


def test_mlflow_one_run_across_a_watchdog_restart_and_a_resume(tracked):
    assert tracked["failed"].returncode == 1, tracked["failed"].stdout[-3000:]
    assert tracked["resumed"].returncode == 0, tracked["resumed"].stdout[-3000:]
    [(run_id, status)] = tracked["between"]  # killed with no restart left: the run is not closed
    assert status == "RUNNING"
    [run] = _runs(tracked["uri"])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    client = mlflow.tracking.MlflowClient(tracking_uri=tracked["uri"])
    steps = [m.step for m in client.get_metric_history(run_id, "train/box_loss")]
    assert sorted(steps) == list(range(EPOCHS))  # each epoch once: 1 and 2 by attempt 1 and 2, 3 by the resume
    params = run.data.params
    assert params["workers"] == "2" and params["attempt2.workers"] == "1"  # 'safe' halves the workers
    tags = run.data.tags
    assert tags["rocm-yolo.attempt"] == "3" and tags["rocm-yolo.restarts"] == "1"
    restart = json.loads(tags["rocm-yolo.attempt.2"])
    assert restart["started_by"] == "watchdog" and restart["cause"] == "crash" and restart["profile"] == "safe"
    assert restart["batch_size"] == 4 and restart["checkpoint"] == "last.pt" and restart["epoch"] in (1, 2)
    resume = json.loads(tags["rocm-yolo.attempt.3"])
    assert resume["started_by"] == "resume" and resume["profile"] == "safe"
    assert json.loads((tracked["run"] / "rocm_yolo" / "tracker.json").read_text())["mlflow_run_id"] == run_id


def _records(path: Path):
    """The protobuf records of a W&B run file: W&B's 7-byte header, then LevelDB's log format (32 KiB blocks,
    chunks with a 7-byte header: CRC, length, type full/first/middle/last)."""
    data, pos, parts, block = path.read_bytes(), 7, [], 32 * 1024
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@pytest.mark.skipif(wandb_internal_pb2 is None, reason="wandb is not installed (the test extra installs it)")
def test_wandb_offline_one_run_id_across_attempts_with_each_attempt_tagged(tracked):
    files = sorted((tracked["run"] / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 3  # offline, each attempt writes its own file; `wandb sync` uploads them in order
    runs = [r.run for f in files for r in _records(f) if r.WhichOneof("record_type") == "run"]
    recorded = json.loads((tracked["run"] / "rocm_yolo" / "tracker.json").read_text())["wandb_id"]
    assert {r.run_id for r in runs} == {recorded}
    tags = list(runs[-1].tags)
    assert any(t.startswith("rocm-yolo attempt 2: crash") and "safe" in t for t in tags), tags
    assert any(t.startswith("rocm-yolo attempt 3: resume") for t in tags), tags
