"""Shared fixtures: a tiny real data set, running the real CLI, counting leftover processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from rocm_yolo.demo import write_demo
from rocm_yolo.proctree import with_env

TAG_VAR = "ROCM_YOLO_TEST_TAG"
# Small enough for a 2-core CPU: 16 train images at imgsz 32, batch 4 -> 4 batches an epoch.
TINY = ["--model", "yolo26n.yaml", "--device", "cpu", "--imgsz", "32", "--batch", "4", "plots=False"]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return write_demo(tmp_path_factory.mktemp("data") / "tiny", train=16, val=8, size=64)


class Cli:
    """Runs the real ``rocm-yolo`` in a subprocess, with a tag to find every process it made."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, TAG_VAR: self.tag, "PYTHONUNBUFFERED": "1"}
        self.env.pop("ROCM_YOLO_FAULT", None)
        self.runs = 0
        self.output: Path | None = None

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        """Start the CLI with its output in a file (a pipe would stay open in orphans and fill up)."""
        self.runs += 1
        self.output = self.cwd / f"cli-{self.runs}.out"
        with open(self.output, "w") as out:
            return subprocess.Popen([sys.executable, "-m", "rocm_yolo", *args], cwd=self.cwd,
                                    env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)

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
        return subprocess.CompletedProcess(proc.args, proc.returncode, self.read(), "")

    def leftovers(self, settle: float = 5.0) -> list[psutil.Process]:
        deadline = time.monotonic() + settle
        while True:
            left = [p for p in with_env(TAG_VAR, self.tag) if p.status() != psutil.STATUS_ZOMBIE]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill_all(self) -> None:
        for proc in with_env(TAG_VAR, self.tag):
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


@pytest.fixture
def cli(tmp_path):
    c = Cli(tmp_path)
    yield c
    c.kill_all()  # never leave a training run behind, whatever the test did


def rocm_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("rocm-yolo:")]
