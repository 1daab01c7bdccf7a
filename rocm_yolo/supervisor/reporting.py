"""Telling the user: each event of a run on the terminal, in ``events.jsonl``, to a notify command, and as metrics.

The events of a run are ``started``, ``hang``, ``crash``, ``restart``, ``finished``, ``failed`` and ``stopped``
(:data:`EVENTS`), one ``finished``, ``failed`` or ``stopped`` per run. Each is one object with ``event``, ``run``
(the run directory, absolute), ``attempt``, ``profile`` and ``time`` (when it is written: ``events.jsonl`` is in
time order), and where known ``epoch``, ``batch`` and ``phase`` (where the run was last heard), ``class``
(:mod:`rocm_yolo.diagnosis.classes`), ``message``, ``exit_code`` and ``detected`` (a failure's notice, wall clock).
:class:`Reporter` writes it as a JSON line into ``RUN/rocm_yolo/events.jsonl`` (with
the run log's other events), and, when the user gave ``--notify CMD`` (or ``ROCM_YOLO_NOTIFY``), runs CMD through
the shell with the object on its standard input, one event after another in order: detached and bounded
(:class:`rocm_yolo.process.background.BackgroundCommands`),
so a command that fails, hangs or does not exist never delays or breaks the run, and is said once in the log.
The last event gets a few seconds to be delivered; then every command still running is killed.

It also keeps ``RUN/rocm_yolo/metrics.prom``, a Prometheus textfile (node_exporter's textfile collector reads it),
written atomically before the notify command hears of the event: the epoch and batch, it/s, the heartbeat's age,
restarts by class (one series per class of :data:`rocm_yolo.diagnosis.classes.CLASSES` from the first write on,
each from 0), the state; every value exactly.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

from rocm_yolo.diagnosis.classes import NAMES as CLASSES
from rocm_yolo.process.background import BackgroundCommands
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.atomic import write_atomic
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.supervisor_state import Failure
from rocm_yolo.supervisor.config import WatchdogConfig

EVENTS = ("started", "hang", "crash", "restart", "finished", "failed", "stopped")
WHERE = ("epoch", "batch", "phase")  # where the run was last heard, in an event
STATES = ("running", "finished", "failed", "stopped")  # the run's state in metrics.prom
METRICS_EVERY = 5.0  # seconds between two writes of metrics.prom while nothing happens


def where(failure: Failure | None, hb: Heartbeat | None) -> dict:
    """Where the run was last heard, for an event (:data:`WHERE`): the failure's place, else the newest heartbeat's
    (none before the first epoch)."""
    if failure is not None:
        return {"epoch": failure.epoch, "batch": failure.batch, "phase": failure.phase}
    return {"epoch": hb.epoch, "batch": hb.batch, "phase": hb.phase} if hb is not None and hb.epoch > 0 else {}


class Reporter:
    def __init__(self, paths: RunPaths, config: WatchdogConfig, log: RunLog, clock=time.monotonic):
        self.run = str(Path(paths.run_dir).resolve())
        self.paths = paths  # a node's, on more than one machine: its own metrics.prom
        self.config = config
        self.log = log
        self.clock = clock
        self.command = config.notify or None
        self.commands = BackgroundCommands(config.notify_timeout, self._notify_failed) if self.command else None
        self.restarts: Counter = Counter({cls: 0 for cls in CLASSES})  # by class: every series from the start
        self.state = "running"
        self.attempt = 1
        self.hb: Heartbeat | None = None
        self._written = -math.inf
        self._metrics_error = False

    # events ---------------------------------------------------------------------------------
    def event(self, kind: str, message: str | None, *, attempt: int, profile: str, say: bool = True, **known) -> dict:
        """Record event ``kind`` (one of :data:`EVENTS`); ``message`` also goes to the terminal when ``say``.

        ``known`` may hold ``epoch``, ``batch``, ``phase``, ``cls``, ``exit_code``, ``detected`` (a failure's notice,
        wall clock: the event's ``time`` is always now, so ``events.jsonl`` stays in time order), each left out when
        None, and any other field for ``events.jsonl`` only.
        """
        payload = {"event": kind, "run": self.run, "attempt": attempt, "profile": profile, "time": time.time()}
        for key in WHERE:
            at = known.pop(key, None)
            if at is not None:
                payload[key] = at
        cls, code, detected = known.pop("cls", None), known.pop("exit_code", None), known.pop("detected", None)
        if cls is not None:
            payload["class"] = cls
        if message:
            payload["message"] = message
        if code is not None:
            payload["exit_code"] = code
        if detected is not None:
            payload["detected"] = detected
        self.attempt = attempt
        if kind == "restart" and cls:
            self.restarts[cls] += 1
        if kind in ("finished", "failed", "stopped"):
            self.state = kind
        if message and say:
            self.log.info(message)
        self.log.event(kind, None, **{k: v for k, v in payload.items() if k != "event"}, **known)
        self.metrics(force=True)  # before the command hears of it: the textfile says it already
        if self.commands is not None:
            self.commands.start(self.command, (json.dumps(payload, default=str) + "\n").encode())
        return payload

    def _notify_failed(self, why: str) -> None:
        self.log.event(
            "notify_error",
            f"the notify command failed ({why}); it never holds training up, and later failures of it are not said",
            error=why,
        )

    def tick(self, hb: Heartbeat | None) -> None:
        """Each tick of the supervisor's loop: reap the notify commands, refresh the metrics now and then."""
        if hb is not None:
            self.hb = hb
        if self.commands is not None:
            self.commands.poll()
        self.metrics()

    def close(self) -> None:
        """The run is over: the metrics say so, and the last event gets ``notify_grace`` seconds to be delivered."""
        self.metrics(force=True)
        if self.commands is not None:
            self.commands.close(self.config.notify_grace)

    # metrics.prom -----------------------------------------------------------------------------
    def metrics(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._written < METRICS_EVERY:
            return
        self._written = now
        try:
            write_atomic(self.paths.metrics, render(self.run, self.hb, self.state, self.restarts, self.attempt))
        except OSError as e:
            if not self._metrics_error:  # bookkeeping never stops a run; say it once
                self._metrics_error = True
                self.log.info(f"cannot write {self.paths.metrics} ({e.strerror or e})")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def value(v: float) -> str:
    """A sample's value exactly, as Prometheus reads it (Go's ``ParseFloat``): an integer as one, any other float as
    the shortest text that reads back the same (``1795740123.456789``, never ``{:g}``'s ``1.79574e+09``)."""
    if isinstance(v, bool) or isinstance(v, int):
        return str(int(v))
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def render(
    run: str, hb: Heartbeat | None, state: str, restarts: Counter, attempt: int, now: float | None = None
) -> str:
    """The Prometheus text exposition of a run (every sample labelled with its run directory)."""
    now = time.time() if now is None else now
    run_label = f'run="{_label(run)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP rocm_yolo_{name} {help}")
        out.append(f"# TYPE rocm_yolo_{name} {kind}")
        for labels, sample in samples:
            out.append(f"rocm_yolo_{name}{{{run_label}{labels}}} {value(sample)}")

    metric(
        "up", "gauge", "1 while the run's supervisor runs, 0 once the run has ended.", [("", int(state == "running"))]
    )
    metric(
        "state",
        "gauge",
        "The run's state (one sample per state, 1 for the current one).",
        [(f',state="{s}"', int(s == state)) for s in STATES],
    )
    metric("attempt", "gauge", "The attempt (1 + restarts, counted across resumes).", [("", attempt)])
    counts = {cls: 0 for cls in CLASSES} | dict(restarts)  # every class's series, from the first write on
    metric(
        "restarts_total",
        "counter",
        "Restarts by the class of the failure they recovered from.",
        [(f',class="{_label(c)}"', n) for c, n in counts.items()],
    )
    if hb is not None:
        metric("epoch", "gauge", "The epoch being trained (1-based).", [("", hb.epoch)])
        metric("epochs", "gauge", "The epochs the run trains.", [("", hb.epochs)])
        metric("batch", "gauge", "Batches done in the current pass (train or validation).", [("", hb.batch)])
        metric("batches", "gauge", "Batches in the current pass.", [("", hb.batches)])
        metric("iterations_per_second", "gauge", "Recent training speed.", [("", hb.it_s)])
        metric("heartbeat_timestamp_seconds", "gauge", "Wall clock of the last heartbeat.", [("", hb.time)])
        metric(
            "heartbeat_age_seconds",
            "gauge",
            "Seconds since the last heartbeat, as of this file's write.",
            [("", max(now - hb.time, 0.0))],
        )
    metric("metrics_timestamp_seconds", "gauge", "Wall clock of this file's write.", [("", now)])
    return "\n".join(out) + "\n"
