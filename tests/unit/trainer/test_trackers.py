"""One tracker run across attempts: the record, the attempts as tags, MLflow's parameters, and the wrappers of
Ultralytics' tracker callbacks, driven with fake libraries (no mlflow, no wandb, no training)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from types import SimpleNamespace

import pytest

from rocm_yolo.policy.profiles import resolve
from rocm_yolo.process.output import RunLog
from rocm_yolo.trainer.callbacks.tracker_record import (
    TrackerRecord,
    attempts,
    mlflow_tags,
    params_to_log,
    wandb_config,
    wandb_tags,
)
from rocm_yolo.trainer.callbacks.trackers import MlflowRun, Trackers
from rocm_yolo.ultralytics_rules import compat


def test_the_record_round_trips_and_a_damaged_one_is_empty(tmp_path):
    path = tmp_path / "rocm_yolo" / "tracker.json"
    assert TrackerRecord.read(path) == TrackerRecord()
    TrackerRecord(mlflow_run_id="abc", mlflow_uri="file:/m", wandb_id="w1").write(path)
    assert TrackerRecord.read(path) == TrackerRecord("abc", "file:/m", "w1")
    path.write_text('{"mlflow_run_id": 3, "wandb_id": "w1", "later": "x"}')
    assert TrackerRecord.read(path) == TrackerRecord(wandb_id="w1")
    path.write_text("[")
    assert TrackerRecord.read(path) == TrackerRecord()


def _attempt(spec, n: int, profile: str, resume: str | None = None):
    loader = resolve(profile, 2, cpu_count=4).loader
    spec.with_changes(attempt=n, profile=profile, loader=loader, resume=resume, train_args={"batch": 8}).save()


def _history(spec):
    """Attempt 1 on fast; 2, a watchdog restart after a crash at epoch 2 batch 5; 3, the user's --resume."""
    _attempt(spec, 1, "fast")
    _attempt(spec, 2, "safe", resume=str(spec.paths.last))
    _attempt(spec, 3, "safe", resume=str(spec.paths.last))
    RunLog(None, spec.paths.events).event("restart", attempt=2, profile="safe", cause="crash", lost_at=[2, 5])


def test_attempts_come_from_the_specs_and_the_restart_events(spec):
    _history(spec)
    first, restart, resume = attempts(spec.paths, upto=3)
    assert (first.started_by, first.profile, first.workers, first.batch_size) == ("start", "fast", 2, 8)
    assert (restart.started_by, restart.cause, restart.epoch, restart.batch) == ("watchdog", "crash", 2, 5)
    assert (restart.profile, restart.workers, restart.checkpoint) == ("safe", 1, "last.pt")
    assert (resume.started_by, resume.cause) == ("resume", None)
    assert [a.attempt for a in attempts(spec.paths, upto=2)] == [1, 2]


def test_a_new_run_in_a_reused_directory_starts_its_own_history(spec):
    _history(spec)
    _attempt(spec, 4, "fast")  # exist_ok=True onto the old directory: a new start
    assert [(a.attempt, a.started_by) for a in attempts(spec.paths, upto=4)] == [(4, "start")]


def test_the_tags_show_every_attempt(spec):
    _history(spec)
    history = attempts(spec.paths, upto=3)
    tags = mlflow_tags(history)
    assert tags["rocm-yolo.attempt"] == "3" and tags["rocm-yolo.profile"] == "safe"
    assert tags["rocm-yolo.restarts"] == "1"
    assert json.loads(tags["rocm-yolo.attempt.2"]) == {
        "attempt": 2,
        "started_by": "watchdog",
        "cause": "crash",
        "epoch": 2,
        "batch": 5,
        "profile": "safe",
        "workers": 1,
        "batch_size": 8,
        "checkpoint": "last.pt",
    }
    assert wandb_config(history)["rocm-yolo"]["attempts"]["3"]["started_by"] == "resume"
    tags = wandb_tags(("mine", "rocm-yolo attempt 2: old"), history)
    assert tags[0] == "mine" and len(tags) == 3  # the user's tag kept, one per attempt after the first
    assert tags[1].startswith("rocm-yolo attempt 2: crash at 2:5") and all(len(t) <= 64 for t in tags)
    assert mlflow_tags([]) == {} and wandb_config([]) == {}


def test_params_already_on_the_run_are_not_logged_again_and_changed_ones_go_under_the_attempt():
    have = {"workers": "2", "epochs": "3", "attempt2.workers": "1"}
    assert params_to_log(have, {"workers": 1, "epochs": 3, "lr0": 0.01}, attempt=3) == {
        "attempt3.workers": 1,
        "lr0": 0.01,
    }
    assert params_to_log(have, {"workers": 1}, attempt=2) == {}  # that attempt already logged it
    assert params_to_log({}, {"workers": 2}, attempt=1) == {"workers": 2}


# The wrappers, with fake Ultralytics callback modules and fake libraries --------------------------------------------


class FakeMlflow:
    """MLflow as the wrappers use it: runs by id, params that refuse a second value."""

    __version__ = "fake"

    def __init__(self):
        self.runs: dict[str, dict] = {}
        self.active = None
        self.tags: dict[str, str] = {}

    def get_tracking_uri(self):
        return "file:/fake"

    def start_run(self, run_id=None, run_name=None):
        if run_id is not None and run_id not in self.runs:
            raise RuntimeError(f"no run {run_id}")
        run_id = run_id or f"run{len(self.runs) + 1}"
        self.runs.setdefault(run_id, {})
        self.active = run_id
        return self.active_run()

    def active_run(self):
        if self.active is None:
            return None
        params = self.runs[self.active]
        return SimpleNamespace(info=SimpleNamespace(run_id=self.active), data=SimpleNamespace(params=params))

    def log_params(self, params):
        have = self.runs[self.active]
        for key, value in params.items():
            if key in have and have[key] != str(value):
                raise RuntimeError("Changing param values is not allowed")
            have[key] = str(value)

    def set_tags(self, tags):
        self.tags.update(tags)


ULTRALYTICS_MLFLOW = """
def on_pretrain_routine_end(trainer):
    trainer._mlflow_active = False
    try:
        mlflow.active_run() or mlflow.start_run(run_name="train")
        mlflow.log_params(vars(trainer.args))
        trainer._mlflow_active = True
    except Exception:
        pass
"""

ULTRALYTICS_WB = """
def on_pretrain_routine_end(trainer):
    if not wb.run:
        wb.init(project="p", name="train", id="new-id", resume=None)
"""


def _module(monkeypatch, key: str, source: str, library_name: str, library):
    name = compat.TRACKER_CALLBACKS[key][0]
    module = types.ModuleType(name)
    module.__spec__ = importlib.util.find_spec(name)  # compat reads Ultralytics' own file
    module.__dict__[library_name] = library
    exec(source, module.__dict__)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _trainer(*callbacks, workers=2):
    return SimpleNamespace(
        args=SimpleNamespace(workers=workers, epochs=3), callbacks={"on_pretrain_routine_end": list(callbacks)}
    )


def _train(owner: Trackers, trainer) -> None:
    owner.on_pretrain_routine_start(trainer)
    for callback in trainer.callbacks["on_pretrain_routine_end"]:
        callback(trainer)


@pytest.fixture
def fake_mlflow(monkeypatch):
    library = FakeMlflow()
    module = _module(monkeypatch, "mlflow", ULTRALYTICS_MLFLOW, "mlflow", library)
    return module, library


def test_every_attempt_continues_the_first_mlflow_run_and_keeps_tracking(spec, fake_mlflow):
    module, library = fake_mlflow
    _history(spec)
    log = RunLog()
    first = _trainer(module.on_pretrain_routine_end)
    _train(Trackers(spec.with_changes(attempt=1), log, enabled=True), first)
    assert first._mlflow_active and library.active == "run1"
    assert TrackerRecord.read(spec.paths.tracker) == TrackerRecord("run1", "file:/fake")
    assert module.mlflow is library  # the proxy is gone after the call

    library.active = None  # a new process: no active run
    restarted = _trainer(module.on_pretrain_routine_end, workers=1)
    owner = Trackers(spec.with_changes(attempt=2), log, enabled=True)
    owner.on_pretrain_routine_start(restarted)
    owner.on_pretrain_routine_start(restarted)  # idempotent: wrapped once
    [wrapper] = restarted.callbacks["on_pretrain_routine_end"]
    assert isinstance(wrapper, MlflowRun) and wrapper.original is module.on_pretrain_routine_end
    wrapper(restarted)
    assert restarted._mlflow_active and list(library.runs) == ["run1"]
    assert library.runs["run1"] == {"workers": "2", "epochs": "3", "attempt2.workers": "1"}
    assert json.loads(library.tags["rocm-yolo.attempt.2"])["cause"] == "crash"


def test_a_run_that_cannot_be_continued_gives_way_to_a_new_one(spec, fake_mlflow, monkeypatch):
    module, library = fake_mlflow
    TrackerRecord("gone", "file:/fake").write(spec.paths.tracker)
    trainer = _trainer(module.on_pretrain_routine_end)
    _train(Trackers(spec, RunLog(), enabled=True), trainer)
    assert trainer._mlflow_active and TrackerRecord.read(spec.paths.tracker).mlflow_run_id == "run1"
    # a run of another tracking URI, or one the user named in MLFLOW_RUN_ID, is not ours to continue
    TrackerRecord("run1", "file:/elsewhere").write(spec.paths.tracker)
    library.active = None
    _train(Trackers(spec, RunLog(), enabled=True), _trainer(module.on_pretrain_routine_end))
    assert library.active == "run2"
    monkeypatch.setenv("MLFLOW_RUN_ID", "users")
    library.active = None
    _train(Trackers(spec, RunLog(), enabled=True), _trainer(module.on_pretrain_routine_end))
    assert library.active == "run3"  # the fake ignores the variable: rocm-yolo did not pass its own run


def test_off_or_not_loaded_leaves_ultralytics_callbacks_as_they_are(spec, fake_mlflow, monkeypatch):
    module, _ = fake_mlflow
    trainer = _trainer(module.on_pretrain_routine_end)
    Trackers(spec, RunLog(), enabled=False).on_pretrain_routine_start(trainer)
    assert trainer.callbacks["on_pretrain_routine_end"] == [module.on_pretrain_routine_end]
    monkeypatch.setenv("ROCM_YOLO_ONE_TRACKER_RUN", "0")
    assert not Trackers(spec, RunLog()).enabled
    monkeypatch.delitem(sys.modules, compat.TRACKER_CALLBACKS["mlflow"][0])  # Ultralytics did not load it
    other = _trainer(print)
    Trackers(spec, RunLog(), enabled=True).on_pretrain_routine_start(other)
    assert other.callbacks["on_pretrain_routine_end"] == [print]


def test_wandb_continues_the_recorded_run_also_after_a_restart_from_the_start(spec, monkeypatch):
    inits = []

    def init(**kwargs):
        inits.append(kwargs)
        config = SimpleNamespace(update=lambda values, allow_val_change: updates.append(values))
        library.run = SimpleNamespace(id=kwargs["id"], tags=("mine",), config=config)

    updates: list = []
    library = SimpleNamespace(run=None, init=init, __version__="fake")
    module = _module(monkeypatch, "wandb", ULTRALYTICS_WB, "wb", library)
    _history(spec)
    trainer = _trainer(module.on_pretrain_routine_end)
    _train(Trackers(spec.with_changes(attempt=1), RunLog(), enabled=True), trainer)
    assert inits[-1]["id"] == "new-id" and TrackerRecord.read(spec.paths.tracker).wandb_id == "new-id"
    library.run = None  # the next attempt's process
    _train(Trackers(spec.with_changes(attempt=2), RunLog(), enabled=True), _trainer(module.on_pretrain_routine_end))
    assert (inits[-1]["id"], inits[-1]["resume"]) == ("new-id", "allow")
    assert library.run.tags[0] == "mine" and library.run.tags[1].startswith("rocm-yolo attempt 2: crash")
    assert updates[-1]["rocm-yolo"]["attempt"] == 2


ULTRALYTICS_WB_8_4_158 = """
def on_pretrain_routine_start(trainer):
    if not wb.run:
        wb.init(project="p", name="train", id="new-id", resume=None)
"""


def test_a_wandb_callback_that_opens_its_run_in_on_pretrain_routine_start_is_wrapped_there(spec, monkeypatch):
    inits = []
    library = SimpleNamespace(run=None, init=lambda **kwargs: inits.append(kwargs), __version__="fake")
    module = _module(monkeypatch, "wandb", ULTRALYTICS_WB_8_4_158, "wb", library)
    TrackerRecord(wandb_id="first-id").write(spec.paths.tracker)
    owner = Trackers(spec, RunLog(), enabled=True)
    hooks = [owner.on_pretrain_routine_start, module.on_pretrain_routine_start]  # Ultralytics adds its own after ours
    trainer = SimpleNamespace(callbacks={"on_pretrain_routine_start": hooks})
    for callback in trainer.callbacks["on_pretrain_routine_start"]:  # as BaseTrainer.run_callbacks
        callback(trainer)
    assert (inits[-1]["id"], inits[-1]["resume"]) == ("first-id", "allow") and module.wb is library
