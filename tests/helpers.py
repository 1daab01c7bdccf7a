"""What the tests share besides fixtures: running the real CLI, waiting, reading a run's files, fake checkpoints."""

from __future__ import annotations

import csv
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import psutil

from rocm_yolo import environment, launch
from rocm_yolo.launch.train_request import TrainRequest
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.process.tree import with_env
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths

TAG_VAR = "ROCM_YOLO_TEST_TAG"
# .ci/run's lower-bound run sets it to the oldest supported Ultralytics, installed apart and put
# first on PYTHONPATH: every process the tests start must then really use that version.
EXPECT_VAR = "ROCM_YOLO_EXPECT_ULTRALYTICS"
HEADER_ULTRALYTICS = re.compile(r"\| Ultralytics (\S+) \|")  # the run header: "torch ... | Ultralytics X | Python ..."
# Small enough for a 2-core CPU: 16 train images at imgsz 32, batch 4 -> 4 batches an epoch.
TINY = ["--model", "yolo26n.yaml", "--device", "cpu", "--imgsz", "32", "--batch", "4", "plots=False"]


class Cli:
    """Runs the real ``rocm-yolo`` in a subprocess, with a tag to find every process it made."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1"}
        for var in (environment.FAULT, environment.RECORD_BATCHES, environment.PLUGINS):
            self.env.pop(var, None)
        self.runs = 0
        self.output: Path | None = None

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """Start the CLI with its output in a file (a pipe would stay open in orphans and fill up)."""
        self.runs += 1
        self.output = self.cwd / f"cli-{self.tag[:8]}-{self.runs}.out"  # two Cli in one directory keep theirs
        with open(self.output, "w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "rocm_yolo", *args],
                cwd=self.cwd,
                env={**self.env, **with_plugin(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def read(self) -> str:
        return self.output.read_text(errors="replace")

    def run(self, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        proc = self.start(*args, env=env)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            proc.wait()
            raise AssertionError(f"rocm-yolo {' '.join(args)} did not finish in {timeout} s:\n{self.read()[-4000:]}")
        text = self.read()
        want = os.environ.get(EXPECT_VAR)
        if want:  # the training child itself says which Ultralytics it imported
            assert set(HEADER_ULTRALYTICS.findall(text)) <= {want}, (
                f"{EXPECT_VAR}={want}, but the run says:\n{text[-3000:]}"
            )
        return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")

    def leftovers(self, settle: float = 5.0) -> list[psutil.Process]:
        deadline = time.monotonic() + settle
        while True:
            left = [p for p in with_env(TAG_VAR, self.tag) if alive(p.pid)]  # not one that exits meanwhile
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill_all(self) -> None:
        for proc in with_env(TAG_VAR, self.tag):
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


def request(data: str | None = None, **kwargs) -> TrainRequest:
    """A train request as ``rocm_yolo.train(data, **kwargs)`` builds it."""
    return TrainRequest.from_kwargs(data, **kwargs)


def prepare(data: str | None = None, **kwargs):
    """``request(...)`` validated and its run directory claimed: the first attempt's spec."""
    return launch.prepare(request(data, **kwargs))


def with_plugin(env: dict) -> dict:
    """``env`` with the testing plugin loaded when it asks for a fault or a batch record (rocm_yolo.run.hooks)."""
    if environment.FAULT in env or environment.RECORD_BATCHES in env:
        return {environment.PLUGINS: "rocm_yolo.testing", **env}
    return env


def wait_for(predicate, timeout, what, proc=None, cli=None):
    """Poll ``predicate`` until it holds; fail at once if ``proc`` exits first (with the end of ``cli``'s output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited early ({proc.returncode}) waiting for {what}:\n{cli.read()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rocm_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("rocm-yolo:")]


def events(run: Path, kind: str) -> list[dict]:
    """The run's events of one kind, oldest first."""
    return [e for e in read_events(RunPaths(run).events) if e["event"] == kind]


def epochs_in(run: Path) -> list[int]:
    """The epochs of the run's results.csv, one per row."""
    with open(run / "results.csv") as f:
        return [int(float(row["epoch"])) for row in csv.DictReader(f)]


def fake_checkpoint(path: Path, payload: bytes | None = None, age: float = 0.0) -> Path:
    """A complete zip with a ``data.pkl`` that pickles a checkpoint dict without tensors, ``age`` seconds old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = (
        pickle.dumps({"epoch": 0, "train_args": {"epochs": 3}, "pad": b"x" * 1000}) if payload is None else payload
    )
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ckpt/data.pkl", payload)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def rows_by_check(rows):
    return {r.check: r for r in rows}
