"""A plugin of rocm_yolo.run.hooks for test_e2e_midepoch: a stop that lands in the middle of a mid-epoch checkpoint's
write (``ROCM_YOLO_PLUGINS=midsave_stop``, with this folder on ``PYTHONPATH``).

``ROCM_YOLO_TEST_MIDSAVE_STOP=SECONDS``: the first mid-epoch checkpoint of the run is written half, then the
supervisor is asked to stop the run (SIGTERM to the trainer's parent, as Ctrl-C or ``scancel`` would), and the
write goes on for SECONDS more before it writes the rest: a write shorter than the supervisor's grace ends before the
trainer does, a longer one is cut short by the SIGKILL that follows. Once per run directory (a marker file).
"""

from __future__ import annotations

import os
import signal
import time

from rocm_yolo.testing.faults import write_first_half

VARIABLE = "ROCM_YOLO_TEST_MIDSAVE_STOP"


def checkpoint_writer(paths, where: tuple[int, int]):
    seconds = os.environ.get(VARIABLE)
    marker = paths.state / "midsave-stop.fired"
    if not seconds or marker.exists():
        return None
    marker.write_text(f"epoch {where[0]} batch {where[1]}\n")

    def stop_halfway(ckpt, f) -> None:
        data = write_first_half(ckpt, f)
        os.kill(os.getppid(), signal.SIGTERM)  # the supervisor stops the tree: SIGTERM reaches the trainer now
        time.sleep(float(seconds))
        f.write(data[len(data) // 2 :])

    return stop_halfway
