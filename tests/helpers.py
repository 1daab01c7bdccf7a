"""What the tests share besides fixtures: running the real CLI, waiting, reading a run's files, fake checkpoints."""

from __future__ import annotations

import csv
import os
import pickle
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil

import rocm_yolo.request
from rocm_yolo.environment import ANY_PLUGIN
from rocm_yolo.process.tagged import Tagged
from rocm_yolo.request.train_request import TrainRequest
from rocm_yolo.run.events import read_events
from rocm_yolo.run.paths import RunPaths

TAG_VAR = "ROCM_YOLO_TEST_TAG"
STRANGER = 65534  # another user (nobody): what they plant belongs to them
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
        self.tagged = Tagged(TAG_VAR)
        self.tag = self.tagged.tag
        self.env: dict[str, str] = {}  # variables for every run of this Cli (on top of this process's)
        self.runs = 0
        self.output: Path | None = None

    def start(self, *args: str, env: dict | None = None, prefix: tuple[str, ...] = (), **popen) -> subprocess.Popen:
        """Start the CLI with its output in a file (the testing plugin is loaded when ``env`` asks for a fault);
        ``prefix``: a command it runs under (``nohup``); ``popen``: more of ``subprocess.Popen``'s arguments."""
        self.runs += 1
        self.output = self.cwd / f"cli-{self.tag[:8]}-{self.runs}.out"  # two Cli in one directory keep theirs
        with open(self.output, "w") as out:
            cmd = [*prefix, sys.executable, "-P", "-m", "rocm_yolo", *args]  # -P: as the console script, no cwd import
            extra = {ANY_PLUGIN: "1", **self.env, **(env or {})}  # a test's own plugin (tests/e2e/midsave_stop.py)
            return self.tagged.start(cmd, cwd=self.cwd, output=out, extra=extra, **popen)

    def environ(self) -> dict[str, str]:
        """The whole environment a run of this Cli gets (for another command that must look like one)."""
        return self.tagged.environ({ANY_PLUGIN: "1", **self.env})

    def read(self) -> str:
        return self.output.read_text(errors="replace")

    def run(self, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        return self.wait(self.start(*args, env=env), timeout)

    def wait(self, proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
        """Wait for a started CLI to end: its exit status and output (all of it killed if it runs past ``timeout``)."""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            proc.wait()
            raise AssertionError(f"{' '.join(proc.args[-6:])} did not finish in {timeout} s:\n{self.read()[-4000:]}")
        text = self.read()
        want = os.environ.get(EXPECT_VAR)
        if want:  # the training child itself says which Ultralytics it imported
            assert set(HEADER_ULTRALYTICS.findall(text)) <= {want}, (
                f"{EXPECT_VAR}={want}, but the run says:\n{text[-3000:]}"
            )
        return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")

    def leftovers(self, settle: float = 5.0) -> list[psutil.Process]:
        return self.tagged.leftovers(settle)

    def refused(self, *args: str, env: dict | None = None, python: str | None = None, timeout: float = 120):
        """Run the CLI (or, with ``python``, that code in a Python process) and watch it to its end: its result, and
        the command line of every process it started meanwhile (polled every few milliseconds: a training child,
        which imports torch, lives for seconds)."""
        if python is None:
            proc = self.start(*args, env=env)
        else:
            self.runs += 1
            self.output = self.cwd / f"py-{self.tag[:8]}-{self.runs}.out"
            with open(self.output, "w") as out:
                proc = self.tagged.start([sys.executable, "-c", python], cwd=self.cwd, output=out, extra=env)
        children = started_by(proc, timeout)
        return self.wait(proc, timeout), children

    def kill_all(self) -> None:
        self.tagged.kill(wait=0)


def started_by(proc: subprocess.Popen, timeout: float) -> list[str]:
    """The command lines of the processes ``proc`` starts until it ends (or ``timeout`` passes)."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        parent = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        return []
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            for child in parent.children(recursive=True):
                try:
                    seen.setdefault(child.pid, " ".join(child.cmdline()) or child.name())
                except psutil.Error:
                    seen.setdefault(child.pid, "(gone before it could be read)")
        except psutil.Error:
            break
        time.sleep(0.005)
    return list(seen.values())


def request(data: str | None = None, **kwargs) -> TrainRequest:
    """A train request as ``rocm_yolo.train(data, **kwargs)`` builds it."""
    return TrainRequest.from_kwargs(data, **kwargs)


def prepare(data: str | None = None, **kwargs):
    """``request(...)`` validated and its run directory claimed: the first attempt's spec."""
    return rocm_yolo.request.prepare(request(data, **kwargs))


def kfd_tree(base: Path, *versions: int | None) -> Path:
    """A KFD topology as the amdgpu driver lays it out: a CPU node, then one node per GPU (``gfx_target_version``
    each, e.g. 110000 for gfx1100); the ``nodes`` directory, for ``ROCM_YOLO_KFD_ROOT``."""
    nodes = base / "nodes"
    (nodes / "0").mkdir(parents=True, exist_ok=True)
    (nodes / "0/properties").write_text("cpu_cores_count 8\ngfx_target_version 0\n")
    for i, version in enumerate(v for v in versions if v):
        (nodes / str(i + 1)).mkdir()
        (nodes / str(i + 1) / "properties").write_text(f"gfx_target_version {version}\nvendor_id 4098\n")
    return nodes


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


SEAMS = Path(__file__).resolve().parent / "seams"


def _with_seams(cli) -> None:
    """``cli``'s processes load tests/seams' sitecustomize (each seam is on when its variable is set)."""
    cli.env["PYTHONPATH"] = os.pathsep.join(x for x in (str(SEAMS), os.environ.get("PYTHONPATH")) if x)


def with_kernel_log(cli, tmp_path) -> Path:
    """Point the supervisor of ``cli``'s runs at a kernel log the test writes (tests/seams)."""
    log = tmp_path / "kern.log"
    log.write_text("")
    _with_seams(cli)
    cli.env["ROCM_YOLO_TEST_KERNEL_LOG"] = str(log)
    return log


def with_cpu_ranks(cli):
    """``cli``'s runs on a machine of two GPUs whose ranks are CPU processes (tests/seams: seam_cpu_ddp)."""
    _with_seams(cli)
    cli.env["ROCM_YOLO_TEST_CPU_DDP"] = "1"
    cli.env["ROCM_YOLO_KFD_ROOT"] = str(SEAMS / "kfd" / "nodes")  # each node: two GPUs, as the seam's ranks are
    return cli


def kernel_line(text: str) -> str:
    """``text`` as the kernel logged it now (journalctl -o short-unix)."""
    return f"{time.time():.6f} testhost kernel: {text}\n"


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


class FakeCgroup:
    """The run's memory cgroup as a fake tree (tests/seams: seam_roots) at the path this process's own
    /proc/self/cgroup names (the CLI's supervisor inherits it): v2's memory.events and memory.max, or, on a machine
    with no v2 line, v1's memory.oom_control and memory.limit_in_bytes. :meth:`kill` counts an OOM kill, as the
    kernel does when its OOM killer kills a process of the cgroup."""

    def __init__(self, root: Path, limit: int):
        self.root, self.kills = root, 0
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        v2 = next((x.split(":", 2)[2] for x in lines if x.startswith("0::")), None)
        v1 = next((x.split(":", 2)[2] for x in lines if "memory" in x.split(":", 2)[1].split(",")), "/")
        if v2 is not None:
            self.folder = root / v2.lstrip("/")
            self.counter, self.line = self.folder / "memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill {}\n"
            limit_file, limit_text = self.folder / "memory.max", f"{limit}\n"
        else:
            self.folder = root / "memory" / v1.lstrip("/")
            self.counter, self.line = (
                self.folder / "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n",
            )
            limit_file, limit_text = self.folder / "memory.limit_in_bytes", f"{limit}\n"
        self.folder.mkdir(parents=True, exist_ok=True)
        limit_file.write_text(limit_text)
        self.counter.write_text(self.line.format(0))

    def kill(self) -> None:
        self.kills += 1
        self.counter.write_text(self.line.format(self.kills))


def with_cgroup(cli, tmp_path, limit: int) -> FakeCgroup:
    """Point the supervisor of ``cli``'s runs at a fake memory cgroup that allows ``limit`` bytes (tests/seams)."""
    _with_seams(cli)
    cli.env["ROCM_YOLO_TEST_CGROUP_ROOT"] = str(tmp_path / "cgroup")
    return FakeCgroup(tmp_path / "cgroup", limit)


def with_proc(cli, tmp_path) -> Path:
    """Point the supervisor of ``cli``'s runs at a fake /proc the test writes (tests/seams): the kernel's view of the
    threads, the start-up's movement and the cgroup come from it; what it lacks is unreadable."""
    _with_seams(cli)
    root = tmp_path / "proc"
    root.mkdir()
    cli.env["ROCM_YOLO_TEST_PROC_ROOT"] = str(root)
    return root


def child_pid(run: Path, proc, cli, attempt: int = 1, timeout: float = 120) -> int:
    """The training process of ``attempt``, as the supervisor recorded it (supervisor.json's child_pid)."""
    from rocm_yolo.run.supervisor_state import read_state

    found: list[int] = []

    def started() -> bool:
        state = read_state(RunPaths(run))
        if state is not None and state.attempt == attempt and state.child_pid:
            found.append(state.child_pid)
        return bool(found)

    wait_for(started, timeout, f"attempt {attempt}'s training process", proc, cli)
    return found[0]


def as_stranger(*paths: Path) -> None:
    """Make ``paths`` another user's (:data:`STRANGER`'s), as if they had planted them; links themselves, not their
    targets. Only root can: elsewhere the test is skipped."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("planting another user's files takes root (chown)")
    for path in paths:
        os.chown(path, STRANGER, STRANGER, follow_symlinks=False)


def start_with_pid(pid: int, cmd: list[str], tries: int = 200) -> subprocess.Popen:
    """Start ``cmd`` (a session of its own: an unrelated tree) as process ``pid``, a number another process had: a
    real reuse of a pid, through the kernel's ``ns_last_pid`` (root only; else the test is skipped). Other processes
    of the machine fork meanwhile: it tries again until it gets the number."""
    import pytest

    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError as e:
            pytest.skip(f"cannot give a process a chosen pid here ({e.strerror}): needs root")
        proc = subprocess.Popen(cmd, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.skip(f"pid {pid} could not be had in {tries} tries (a busy machine)")
