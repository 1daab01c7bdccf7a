"""``ROCM_YOLO_RECORD_BATCHES=FILE``: one JSON line per training batch, in the order trained.

Each line holds the attempt, the rank (0 on one GPU), the epoch (1-based), the loop's batch index and the batch's
image file names; the tests compare sample orders across restarts and resumes with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from rocm_yolo.patches.saves import trainloop
from rocm_yolo.run.devices import rank


class BatchRecorder:
    """An Ultralytics callback that appends what each training batch held to a file."""

    def __init__(self, path: str, attempt: int):
        self.path = path
        self.attempt = attempt

    def on_train_batch_end(self, trainer) -> None:
        loop = trainloop.read_locals(trainloop.loop_frame(trainer), ("i", "batch"))
        batch = loop.get("batch") or {}
        line = {
            "attempt": self.attempt,
            "rank": rank() or 0,
            "epoch": trainer.epoch + 1,
            "batch": loop.get("i"),
            "files": [Path(f).name for f in batch.get("im_file", ())],
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
