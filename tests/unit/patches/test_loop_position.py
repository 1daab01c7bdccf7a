"""Ultralytics' training loop continued inside an epoch: its locals set from a callback, its ``enumerate`` offset."""

from __future__ import annotations

from rocm_yolo.patches.saves import loop_position


class Toy:
    """A stand-in with the loop's shape: locals i (a cell, as in _do_train on 3.11), last_opt_step."""

    def __init__(self, callback):
        self.callback = callback

    def _do_train(self):
        last_opt_step = -1
        seen = []
        for i, item in enumerate(range(3)):
            self.callback(self)
            seen.append((i, last_opt_step, {k: i for k in "a"}["a"]))
        return seen


def test_loop_locals_can_be_set_from_a_callback():
    def callback(trainer):
        frame = loop_position.loop_frame(trainer)
        if loop_position.read_locals(frame)["i"] == 1:
            loop_position.set_local(frame, "last_opt_step", 7)

    assert Toy(callback)._do_train() == [(0, -1, 0), (1, 7, 1), (2, 7, 2)]


def test_enumerate_offset_only_for_the_armed_loader_and_removable():
    import ultralytics.engine.trainer as module

    loop_position.install()
    loop_position.install()  # idempotent
    try:
        data = ["c", "d", "e"]  # what the sampler yields for a pass resumed after 2 of 5 batches
        loop_position.arm(data, start=2, count=3)
        assert list(module.enumerate(data)) == [(2, "c"), (3, "d"), (4, "e")]
        assert list(module.enumerate(["x"])) == [(0, "x")]  # any other iterable: the builtin
        loop_position.disarm()
        assert list(module.enumerate(data)) == [(0, "c"), (1, "d"), (2, "e")]
    finally:
        loop_position.uninstall()
    assert "enumerate" not in module.__dict__ and not loop_position.installed()
