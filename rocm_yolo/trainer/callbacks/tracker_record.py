"""What makes the attempts of one run one tracker run: its tracker ids, and its attempts as the tracker shows them.

- :class:`TrackerRecord` is ``RUN/rocm_yolo/tracker.json``: the MLflow run (and its tracking URI)
  and the W&B run the first attempt opened. Each later attempt of the run, a watchdog restart
  or a ``--resume``, continues them. A new run (also one that reuses a directory) starts
  without one: :func:`rocm_yolo.request.claim.claim` removes it.
- :func:`attempts` reads every attempt of the run from its own files (``spec-K.json`` and the
  supervisor's ``restart`` events): why it started (``start``, ``watchdog``, ``resume``), the
  failure a restart recovered from (cause, epoch and batch as last heard), its profile,
  workers and batch size. Each attempt tags the tracker run with all of them, so a tracker
  that keeps only the newest tags (W&B offline runs, synced in order) still shows each one.
- :func:`params_to_log`: MLflow refuses a parameter logged again with another value, and
  Ultralytics' callback then stops tracking; what changed goes under ``attemptN.KEY``.

Pure: no torch, no Ultralytics, no tracker library.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec

TAG_PREFIX = "rocm-yolo"  # MLflow tags rocm-yolo sets: rocm-yolo.attempt, rocm-yolo.attempt.2, ...
WANDB_TAG_LENGTH = 64  # W&B's limit on one tag


@dataclass(frozen=True)
class TrackerRecord:
    """The tracker runs of one rocm-yolo run (``None``: not opened yet)."""

    mlflow_run_id: str | None = None
    mlflow_uri: str | None = None  # the tracking URI the run lives in: another URI does not have it
    wandb_id: str | None = None

    @classmethod
    def read(cls, path: str | os.PathLike) -> "TrackerRecord":
        """The record at ``path``; an empty one if missing or damaged (a new tracker run is the worst case)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__ and isinstance(v, str)})

    def write(self, path: str | os.PathLike) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(asdict(self)))


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run, as the tracker run records it."""

    attempt: int
    started_by: str  # start | watchdog | resume
    profile: str
    workers: int
    batch_size: int | float | None  # None: Ultralytics' default
    checkpoint: str | None = None  # the checkpoint it resumed from (file name)
    cause: str | None = None  # a watchdog restart: hang | crash
    epoch: int | None = None  # where the failed attempt was last heard (1-based epoch, batches done in it)
    batch: int | None = None

    def as_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)

    def short(self) -> str:
        """A line of at most 64 characters (a W&B tag): ``rocm-yolo attempt 2: crash at 2:1, safe, batch 4``."""
        if self.cause:
            where = f" at {self.epoch}:{self.batch}" if self.epoch is not None else ""
            why = f"{self.cause}{where}"
        else:
            why = self.started_by
        text = f"{TAG_PREFIX} attempt {self.attempt}: {why}, {self.profile}, batch {self.batch_size or 'default'}"
        return text[:WANDB_TAG_LENGTH]


def attempts(paths: RunPaths, upto: int) -> list[Attempt]:
    """The run's attempts up to ``upto``, oldest first, from its spec files and the supervisor's restart events."""
    restarts = {e.get("attempt"): e for e in read_events(paths.events) if e.get("event") == "restart"}
    out = []
    for path in paths.specs():
        try:
            spec = RunSpec.load(path)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        if spec.attempt > upto:
            break
        out.append(_attempt(spec, restarts.get(spec.attempt)))
    starts = [i for i, a in enumerate(out) if a.started_by == "start"]
    return out[starts[-1] :] if starts else out  # a reused directory keeps an older run's specs


def _attempt(spec: RunSpec, restart: dict | None) -> Attempt:
    lost_at = (restart or {}).get("lost_at")
    epoch, batch = lost_at if isinstance(lost_at, list) and len(lost_at) == 2 else (None, None)
    started_by = "watchdog" if restart else "resume" if spec.resume else "start"
    return Attempt(
        attempt=spec.attempt,
        started_by=started_by,
        profile=spec.profile,
        workers=spec.loader.workers,
        batch_size=spec.train_args.get("batch"),
        checkpoint=Path(spec.resume).name if spec.resume else None,
        cause=(restart or {}).get("cause"),
        epoch=epoch,
        batch=batch,
    )


def mlflow_tags(history: list[Attempt]) -> dict[str, str]:
    """The tags on the MLflow run: the current attempt and profile, the restarts so far, and one tag per attempt."""
    if not history:
        return {}
    current = history[-1]
    tags = {
        f"{TAG_PREFIX}.attempt": str(current.attempt),
        f"{TAG_PREFIX}.profile": current.profile,
        f"{TAG_PREFIX}.restarts": str(sum(a.started_by == "watchdog" for a in history)),
    }
    tags.update({f"{TAG_PREFIX}.attempt.{a.attempt}": a.as_json() for a in history})
    return tags


def wandb_config(history: list[Attempt]) -> dict:
    """rocm-yolo's entry in the W&B run's config: the current attempt, and every attempt so far."""
    if not history:
        return {}
    current = history[-1]
    return {
        TAG_PREFIX: {
            "attempt": current.attempt,
            "profile": current.profile,
            "restarts": sum(a.started_by == "watchdog" for a in history),
            "attempts": {str(a.attempt): json.loads(a.as_json()) for a in history},
        }
    }


def wandb_tags(existing, history: list[Attempt]) -> tuple[str, ...]:
    """The W&B run's tags: the user's own, then one per attempt after the first."""
    own = tuple(t for t in existing or () if not str(t).startswith(f"{TAG_PREFIX} attempt "))
    return own + tuple(a.short() for a in history if a.started_by != "start")


def params_to_log(have: Mapping[str, str], params: Mapping, attempt: int) -> dict:
    """What of ``params`` to log on an MLflow run that already has ``have`` (as MLflow keeps them: strings).

    A parameter the run has with the same value is not logged again; one whose value changed
    (``workers`` on another profile, ``resume``) is logged as ``attempt{N}.KEY``, since MLflow
    refuses a second value for a key.
    """
    out = {}
    for key, value in params.items():
        if key not in have:
            out[key] = value
        elif have[key] != str(value):
            qualified = f"attempt{attempt}.{key}"
            if qualified not in have:
                out[qualified] = value
    return out
