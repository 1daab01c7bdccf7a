"""A worker's report of a batch hand-over its taker broke: dropped; every other report kept (worker_deaths)."""

from __future__ import annotations

import sys
from multiprocessing import resource_sharer

import pytest

from rocm_yolo.patches.loaders import worker_deaths


def raised(kind: type[BaseException], where: str):
    """``kind`` raised by code whose frame belongs to the file ``where`` (as the hand-over thread's would)."""
    args = "" if kind is EOFError else "5, 'an error'" if kind is OSError else "32, 'an error'"  # OSError(32): a pipe
    try:
        exec(compile(f"raise {kind.__name__}({args})", where, "exec"))
    except kind:
        return sys.exc_info()
    raise AssertionError("not raised")


@pytest.fixture
def reports(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *info: seen.append(info[0]))
    worker_deaths.quiet_handover_breaks()
    hook = sys.excepthook
    worker_deaths.quiet_handover_breaks()
    assert sys.excepthook is hook  # idempotent: one wrapper
    return seen


def test_a_hand_over_broken_by_its_taker_is_not_reported(reports):
    for kind in worker_deaths.HANDOVER_BREAKS:
        sys.excepthook(*raised(kind, resource_sharer.__file__))
    assert reports == []


def test_every_other_report_reaches_the_hook_there_was(reports):
    sys.excepthook(*raised(BrokenPipeError, __file__))  # a broken pipe elsewhere
    sys.excepthook(*raised(OSError, resource_sharer.__file__))  # another error of the hand-over
    assert reports == [BrokenPipeError, OSError]
