"""Shared fixtures: the Ultralytics version check, tiny real data sets, the real CLI, a run's spec.

Helpers the tests import (the CLI runner, waiting, reading a run's files) are in ``helpers.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# One OpenMP thread for torch in every process the tests start (and in this one, before it imports torch), unless
# the developer chose otherwise: on two cores the tests run two trainings at once, each a trainer, a fork server
# and workers. Measured: the suite's user+sys CPU 1332 -> 1280 s, unit/conv/test_patch 53 -> 31 (CONTRIBUTING).
# Ranks got one already (torch.distributed.run sets it); the fork server's own default is still tested
# (test_e2e_train's api_run runs without it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import EXPECT_VAR, Cli  # noqa: E402
from rocm_yolo.policy.profiles import resolve  # noqa: E402
from rocm_yolo.request.cluster import JOB_VARIABLES  # noqa: E402
from rocm_yolo.request.demo import write_demo  # noqa: E402
from rocm_yolo.run.spec import RunSpec  # noqa: E402
from taskdata import TASKS, write_task_data  # noqa: E402

pytest_plugins = ["time_by_file"]  # --time-by-file: each test file's wall and CPU seconds


def pytest_sessionstart(session):
    """rocm-yolo's modules compiled once, before the tests start hundreds of processes that import them: where
    PYTHONDONTWRITEBYTECODE is set (this machine, CI's), each would compile them again (about 0.4 s of CPU for all
    of them). Python reads the bytecode whatever that variable says. Once per session: not in xdist's workers."""
    if hasattr(session.config, "workerinput"):
        return
    import compileall
    from importlib.util import find_spec

    for package in ("rocm_yolo", "rocm_yolo.patches"):  # found, not imported (the patches import torch)
        for folder in find_spec(package).submodule_search_locations:
            compileall.compile_dir(folder, quiet=2)


def pytest_collection_modifyitems(items):
    """The tiers (pyproject's markers): everything under tests/e2e/ trains for real and is marked ``e2e``; every
    other test is ``quick``, as is each end-to-end test marked so itself (one scenario per process role).
    ``make test`` runs ``-m quick``, ``make test-all`` everything."""
    for item in items:
        if f"{os.sep}e2e{os.sep}" in str(item.path):
            item.add_marker(pytest.mark.e2e)
        else:
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def own_directory(tmp_path, monkeypatch):
    """Every test runs in a directory of its own: what a user's checkout holds (the demo's ``runs/`` after
    ``make demo``) is never what a test finds."""
    monkeypatch.chdir(tmp_path)


# A scheduler's variables form a multi-node job with no node flags (rocm_yolo.request.cluster): inside a SLURM
# allocation every rocm-yolo the tests start would join one. The tests form the jobs they mean themselves: every
# variable that forms one (JOB_VARIABLES: MASTER_*, and each scheduler backend's own) is stripped.
@pytest.fixture(scope="session", autouse=True)
def no_scheduler_job():
    saved = {k: os.environ.pop(k) for k in JOB_VARIABLES if k in os.environ}
    yield
    os.environ.update(saved)


TRACKERS = ("clearml", "comet", "dvc", "mlflow", "neptune", "raytune", "tensorboard", "wandb")


@pytest.fixture(scope="session", autouse=True)
def ultralytics_settings(tmp_path_factory):
    """Ultralytics' settings of the session's own (``YOLO_CONFIG_DIR``), not the user's ``settings.json``: no
    analytics and no experiment tracker, so what a test sees does not depend on the machine's settings, and no
    training imports MLflow or W&B (about 0.8 s of CPU each where the test extra installed them). The tracker
    tests turn them on in settings of their own."""
    config = tmp_path_factory.mktemp("ultralytics-config")
    saved = os.environ.get("YOLO_CONFIG_DIR")
    os.environ["YOLO_CONFIG_DIR"] = str(config)  # before this process imports Ultralytics, if it has not yet
    from ultralytics.utils import SettingsManager

    settings = SettingsManager(file=config / "Ultralytics" / "settings.json")  # Ultralytics' defaults, saved
    settings.update({k: False for k in ("sync", *TRACKERS) if k in settings})
    yield config
    if saved is None:
        os.environ.pop("YOLO_CONFIG_DIR", None)
    else:
        os.environ["YOLO_CONFIG_DIR"] = saved


@pytest.fixture(scope="session", autouse=True)
def expected_ultralytics(tmp_path_factory):
    """Under ROCM_YOLO_EXPECT_ULTRALYTICS=VERSION, stop at once unless a process started as the tests start
    rocm-yolo (in another directory: a relative PYTHONPATH would not reach it) imports Ultralytics VERSION.
    A lower-bound run that tested the venv's own Ultralytics would prove nothing."""
    want = os.environ.get(EXPECT_VAR)
    if not want:
        return None
    code = "import ultralytics; print(ultralytics.__version__, ultralytics.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path_factory.getbasetemp(), capture_output=True, text=True, timeout=120
    )
    found = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
    if found.split(" ")[0] != want:
        pytest.exit(
            f"{EXPECT_VAR}={want}, but the test processes import: {found} "
            f"(PYTHONPATH={os.environ.get('PYTHONPATH', '')!r})",
            returncode=1,
        )
    return found


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return write_demo(tmp_path_factory.mktemp("data") / "tiny", train=16, val=8, size=64)


@pytest.fixture(scope="session")
def task_data(tmp_path_factory) -> dict[str, Path]:
    """Every task's tiny data set (classify, segment, pose, obb), shared: copy it before changing it."""
    root = tmp_path_factory.mktemp("taskdata")
    return {t: write_task_data(root / t, t, train=16 if t == "classify" else 8) for t in TASKS}


@pytest.fixture
def demo(tmp_path):
    return write_demo(tmp_path / "d", train=8, val=4, size=64)


@pytest.fixture
def cli(tmp_path):
    c = Cli(tmp_path)
    yield c
    c.kill_all()  # never leave a training run behind, whatever the test did


@pytest.fixture
def spec(tmp_path):
    """A run's spec as the supervisor sees it (no claim, no data): for driving the loop with scripted children."""
    r = resolve("fast", 2, cpu_count=4)
    return RunSpec(
        data="d.yaml",
        model="m.yaml",
        run_dir=str(tmp_path / "run"),
        profile="fast",
        loader=r.loader,
        val=r.val,
        train_args={"epochs": 3},
    )
