"""The registry of rocm-yolo's Ultralytics callbacks: every owner's methods are events Ultralytics fires."""

from __future__ import annotations

import inspect
import os
import pickle

from rocm_yolo.testing.faults import Injector
from rocm_yolo.testing.recorder import BatchRecorder
from rocm_yolo.trainer.callbacks.heartbeat_writer import HeartbeatWriter
from rocm_yolo.trainer.callbacks.registry import CALLBACK_EVENTS, callbacks_of, register
from rocm_yolo.trainer.callbacks.trackers import Trackers
from rocm_yolo.trainer.callbacks.trainer_settings import TrainerSettings
from rocm_yolo.trainer.forkserver.server import ServerReady
from rocm_yolo.trainer.midepoch.restore import MidEpochResume
from rocm_yolo.trainer.midepoch.save import MidEpochSave

OWNERS = (
    TrainerSettings,
    HeartbeatWriter,
    MidEpochSave,
    MidEpochResume,
    Injector,
    BatchRecorder,
    Trackers,
    ServerReady,
)


def test_every_callback_method_is_an_event_ultralytics_fires():
    from ultralytics.utils.callbacks.base import default_callbacks

    assert set(CALLBACK_EVENTS) <= set(default_callbacks)
    for owner in OWNERS:
        methods = {name for name, _ in inspect.getmembers(owner, inspect.isfunction) if name.startswith("on_")}
        assert methods and methods <= set(CALLBACK_EVENTS), (owner.__name__, methods - set(CALLBACK_EVENTS))


def test_callbacks_of_takes_the_events_an_owner_defines_and_nothing_else():
    class Owner:
        def on_train_start(self, trainer):
            return "start"

        def on_model_save(self, trainer):
            return "save"

        def on_somthing_else(self, trainer):  # not an event: never registered
            return "never"

        def helper(self):
            return "never"

    found = callbacks_of(Owner())
    assert list(found) == ["on_train_start", "on_model_save"] and found["on_model_save"](None) == "save"


def test_register_adds_each_owners_callbacks_in_order():
    added = []

    class Model:
        def add_callback(self, event, fn):
            added.append((event, fn.__self__.name))

    class First:
        name = "first"

        def on_train_epoch_start(self, trainer):
            pass

        def on_train_batch_end(self, trainer):
            pass

    class Second:
        name = "second"

        def on_train_epoch_start(self, trainer):
            pass

    register(Model(), [First(), Second()])
    starts = [who for event, who in added if event == "on_train_epoch_start"]
    assert starts == ["first", "second"] and ("on_train_batch_end", "first") in added


def test_the_verified_copy_of_last_pt_is_made_off_the_training_thread_but_never_missing(tmp_path):
    """An epoch's copy is made by a thread the next save waits for; the last save's copy (trainer.stop: the end of
    training strips last.pt next) is made before the training goes on; listeners hear each verified epoch."""
    import types

    from helpers import fake_checkpoint
    from rocm_yolo.process.output import RunLog
    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.trainer.callbacks.good_copy import GoodCopy

    paths = RunPaths(tmp_path)
    fake_checkpoint(paths.last, payload=pickle.dumps({"epoch": 0}))
    heard = []
    copy = GoodCopy(RunLog(stream=open(os.devnull, "w")), on_verified=(heard.append,))
    trainer = types.SimpleNamespace(last=paths.last, epoch=0, stop=False)
    copy.on_model_save(trainer)
    assert copy.copier is not None  # the training thread goes on while the copy is made
    copy.on_train_epoch_end(trainer)  # the next epoch trained: the copy is done before its save
    assert copy.copier is None and heard == [0]
    fake_checkpoint(paths.last, payload=pickle.dumps({"epoch": 1}))
    copy.on_model_save(types.SimpleNamespace(last=paths.last, epoch=1, stop=True))  # waits, then copies at once
    assert copy.copier is None and heard == [0, 1]
    assert paths.last_good.read_bytes() == paths.last.read_bytes()


def test_the_first_batch_waits_for_this_attempts_fork_server_to_be_ready_as_start_up(tmp_path, monkeypatch):
    """The server's imports are start-up: the heartbeat says "first batch" only once they are done (a record of an
    earlier attempt's server does not count); without a fork server nothing waits."""
    import json
    import threading
    import time

    from rocm_yolo.run.paths import RunPaths
    from rocm_yolo.trainer.forkserver import server as forkserver

    record = RunPaths(tmp_path).forkserver(None)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"trainer": 1}))  # an earlier attempt's server
    monkeypatch.setattr(forkserver, "server_pid", lambda: 4242)
    ready = forkserver.ServerReady(tmp_path, timeout=10)
    threading.Timer(0.5, lambda: record.write_text(json.dumps({"trainer": os.getpid()}))).start()
    began = time.monotonic()
    ready.on_train_epoch_start(None)
    assert 0.4 < time.monotonic() - began < 5
    began = time.monotonic()
    ready.on_train_epoch_start(None)  # the next epochs: no wait
    monkeypatch.setattr(forkserver, "server_pid", lambda: None)
    forkserver.ServerReady(tmp_path / "none", timeout=10).on_train_epoch_start(None)  # no fork server: no wait
    assert time.monotonic() - began < 0.5
