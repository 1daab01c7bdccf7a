"""``ROCM_YOLO_RECORD_BATCHES=FILE``: one JSON line per training batch, in the order trained.

Each line holds the attempt, the rank (0 on one GPU), the epoch (1-based), the loop's batch index (``ni`` too), the
batch's image file names (every micro-batch's, on a GPU that trains several a step), the images of each micro-batch,
and whether the optimizer stepped after it; the tests compare sample orders and steps across restarts and resumes
with it. At the end of training rank 0 also writes the raw model's trainable parameters, in float32, beside it
(``FILE.weights.pt``): checkpoints hold the EMA in float16, too coarse to compare two runs' weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from rocm_yolo.patches.saves import loop_position
from rocm_yolo.run.devices import rank


class BatchRecorder:
    """An Ultralytics callback that appends what each training batch held to a file."""

    def __init__(self, path: str, attempt: int):
        self.path = path
        self.attempt = attempt

    def on_train_batch_end(self, trainer) -> None:
        loop = loop_position.read_locals(loop_position.loop_frame(trainer), ("i", "batch", "ni", "last_opt_step"))
        batch = loop.get("batch") or {}
        parts = [batch, *getattr(batch, "rest", ())]  # a GPU that trains several micro-batches a step
        line = {
            "attempt": self.attempt,
            "rank": rank() or 0,
            "epoch": trainer.epoch + 1,
            "batch": loop.get("i"),
            "files": [Path(f).name for part in parts for f in part.get("im_file", ())],
            "parts": [len(part.get("im_file", ())) for part in parts],  # the images of each micro-batch
            "ni": loop.get("ni"),
            "stepped": loop.get("ni") is not None and loop.get("ni") == loop.get("last_opt_step"),  # optimizer
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def on_train_end(self, trainer) -> None:
        if rank():
            return
        import torch

        from rocm_yolo.trainer.midepoch.capture import unwrap

        params = {k: v.detach().float().cpu() for k, v in unwrap(trainer.model).named_parameters()}
        torch.save(params, f"{self.path}.weights.pt")
