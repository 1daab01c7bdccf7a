"""A lent GPU pays off in one command: every open GPU measurement, in at most 8 minutes, into one markdown report.

A GPU machine is lent rarely and for minutes, so its minutes must not go to writing scripts. This one runs the
steps of issue 33 in order of value, each with a time budget, and rewrites ``REPORT_DIR/gpu-acceptance.md`` after
every step (a run the machine cuts off still leaves a report), with every command's output in ``REPORT_DIR/logs/``
and each real failure's stderr as a corpus case in ``REPORT_DIR/corpus.jsonl`` (the fields of
``../shared/corpus/failures.jsonl``). The data is ``_photos.py``'s real-photo set (``../shared/GPU.md``).

1. first batch with 1 and 8 workers, ``fast`` (the fork server) against plain Ultralytics' fork (``bench_loader.py``);
2. first and steady epochs of ``fast``, ``safe``, ``threads``, ``single`` against plain Ultralytics with 8 workers
   and with ``workers=0``, interleaved (``bench_train.py``);
3. what ``--conv auto`` picks on this machine, and the self-test's timings (``rocm_yolo.conv.selftest``);
4. after SIGKILL of a training process that holds the GPU: seconds until its memory is released (``nvidia-smi``,
   or the KFD's process list and ``mem_info_vram_used``), and what ``rocm_yolo.gpu.release`` waited;
5. real DataLoader worker hangs recovered on the GPU (``bench_watchdog.hang_round``): one before the first batch
   (the seeds' "0/N"), one mid-run; detection, time to training again, batches trained again;
6. real GPU failures for the diagnosis: out of memory (a batch far too large: the class, and whether the advised
   batch then trains) and a device-side assert (``ROCM_YOLO_FAULT=device-assert``: the class);
7. with two or more GPUs: DDP against plain Ultralytics' DDP (``bench_ddp.py``), and a rank's worker hang recovered;
8. the machine line.

A step that overruns its budget is recorded as cut short, one that fails as failed, and the next one runs.
``--dry-run`` runs every step at toy size on the CPU, as far as a CPU allows, and skips what needs a GPU with the
reason (``tests/e2e/test_e2e_gpu_acceptance.py`` runs it, so the script cannot rot).

    python benchmarks/gpu_acceptance.py "$OUT/gpu-acceptance"              # on the lent machine: --device 0
    python benchmarks/gpu_acceptance.py --dry-run /tmp/gpu-acceptance      # on a CPU: toy sizes, about 2 minutes
    bash benchmarks/gpu_run.sh                                             # the whole lent session (GPU.md recipe)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_watchdog  # noqa: E402
from _common import TAG_VAR, machine_line, run_logged, stop_on_signals  # noqa: E402
from _photos import write_photo_set  # noqa: E402

from rocm_yolo.gpu import release  # noqa: E402
from rocm_yolo.gpu.arch import detect_gpus  # noqa: E402
from rocm_yolo.gpu.torch_build import torch_build  # noqa: E402
from rocm_yolo.process.tagged import Tagged  # noqa: E402
from rocm_yolo.run import heartbeat  # noqa: E402
from rocm_yolo.run.events import read_events  # noqa: E402
from rocm_yolo.run.paths import RunPaths  # noqa: E402
from rocm_yolo.run.supervisor_state import read_state  # noqa: E402

PY = sys.executable
REPORT = "gpu-acceptance.md"
TITLES = {
    1: "First batch: 1 and 8 workers, `fast` (the fork server) against plain Ultralytics' fork",
    2: "First and steady epochs: every profile against plain Ultralytics, 8 workers and `workers=0`",
    3: "Conv `auto`: the strategy it picks, with its timings",
    4: "GPU memory after SIGKILL of a training process, and what `gpu/release` waited",
    5: "Real worker hangs recovered on the GPU: before the first batch, and mid-run",
    6: "Real GPU failures for the diagnosis: out of memory, and a device-side assert",
    7: "Two or more GPUs: DDP against plain Ultralytics' DDP, and a rank's worker hang recovered",
    8: "The machine",
}
ORDER = (8, 3, 4, 1, 6, 2, 5, 7)  # by value: the cheap and never measured first, the long epoch table late
# Seconds on the GPU; --budget caps the sum. On the lent H100 the steps took 0, 40 (3: its self-test's last strategy
# ran out of time), 24, 33, 81, 207 (2: six sides of 3 epochs), and 62 and 64 for step 5's two hangs: 511 s in all. So
# in the default 480 s on one GPU, step 5's second hang (the one before the first batch) is cut short; --budget 520
# runs everything.
BUDGET = {8: 15, 3: 30, 4: 40, 1: 45, 6: 100, 2: 215, 5: 130, 7: 150}
MIN_STEP = 20.0  # a step with less left of the total is not started


@dataclass(frozen=True)
class Sizes:
    train: int  # real-photo train images: steps 1, 2 and the out-of-memory run
    val: int
    small: int  # the small set's train images (the first of the set): steps 4 to 7
    imgsz: int
    batch: int
    workers: int  # 8 on the GPU machine, as its 0.1 figures
    epochs: int  # step 2, >= 3: epoch 1 is start-up, the last holds the final validation, the others are steady
    sides: tuple  # step 2's sides (bench_train.py --sides)
    loader: tuple  # step 1: bench_loader.py's --workers and --batches
    hang: tuple  # steps 5 and 7: batch, workers (enough batches after the hang that prefetching cannot hide it)
    # step 6: model, imgsz, batch far beyond the card, even after Ultralytics halved it 3 times in its first epoch
    # (yolo26x at 2048 px: about 10 GB an image); loaded in the main process (no worker's batches in /dev/shm),
    # without mosaic (a quarter of the decoding)
    oom: tuple
    conv: tuple = ()  # step 3: more arguments of the self-test
    stall: int = 10  # steps 5 and 7: --stall-timeout of the hang runs (the shortest rocm-yolo takes)


GPU_SIZES = Sizes(
    train=256, val=16, small=64, imgsz=640, batch=32, workers=8, epochs=3,
    sides=("plain-0", "plain-W", "fast", "safe", "threads", "single"), loader=("1,8", 4), hang=(8, 4),
    oom=("yolo26x.yaml", 2048, 128),
)  # fmt: skip
OOM_ARGS = ("--profile", "single", "mosaic=0.0")
DRY_SIZES = Sizes(
    train=16, val=4, small=16, imgsz=32, batch=4, workers=2, epochs=3, sides=("plain-0", "single"),
    loader=("1", 1), hang=(4, 2), oom=("yolo26n.yaml", 64, 16),
    conv=("--strategies", "native", "--time-imgsz", "32", "--time-batch", "1", "--time-budget", "0"),
)  # fmt: skip


class CutShort(Exception):
    """The step's budget ran out."""


class Skip(Exception):
    """The step cannot run here (the reason)."""


@dataclass
class Section:
    n: int
    status: str = "not run yet"
    body: list = field(default_factory=list)
    commands: list = field(default_factory=list)
    seconds: float | None = None
    budget: float | None = None

    def render(self) -> list[str]:
        took = f" in {self.seconds:.0f} s (budget {self.budget:.0f} s)" if self.seconds is not None else ""
        out = [f"## {self.n}. {TITLES[self.n]}", "", f"Status: {self.status}{took}", ""]
        out += [*spaced(self.body), ""] if self.body else []
        return out + (["Commands:", "", "```", *self.commands, "```", ""] if self.commands else [])


def spaced(lines: list[str]) -> list[str]:
    """``lines`` with a blank line before and after each table (Markdown needs the one before)."""
    out: list[str] = []
    for line in lines:
        table, before = line.startswith("|"), out[-1] if out else ""
        if line and before and table != before.startswith("|"):
            out.append("")
        out.append(line)
    return out


@dataclass
class Ran:
    code: int | None  # None: cut short
    text: str
    log: Path


# the GPUs ------------------------------------------------------------------------------------------------------
def nvidia_smi(query: str) -> list[list[str]] | None:
    """``nvidia-smi --query-QUERY`` as rows of fields; None without nvidia-smi or when it fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


@dataclass
class Gpus:
    """The machine's GPUs: NVIDIA's through nvidia-smi, AMD's through the KFD topology and sysfs."""

    names: list = field(default_factory=list)
    driver: str = ""
    vendor: str = ""  # nvidia | amd | ""
    kfd: list = field(default_factory=list)  # AMD: rocm_yolo.gpu.arch.GpuNode

    @classmethod
    def find(cls) -> "Gpus":
        rows = nvidia_smi("gpu=name,memory.total,driver_version")
        if rows:
            return cls([f"{r[0]} ({float(r[1]) / 1024:.0f} GiB)" for r in rows], rows[0][2], "nvidia")
        kfd = detect_gpus()
        if not kfd:
            return cls()
        try:
            driver = "amdgpu " + Path("/sys/module/amdgpu/version").read_text().strip()
        except OSError:
            driver = f"amdgpu of kernel {os.uname().release}"
        sizes = release.vram(kfd)
        names = [g.describe() + (f" {sizes[g.node][1] / 2**30:.0f} GiB" if g.node in sizes else "") for g in kfd]
        return cls(names, driver, "amd", kfd)

    def memory(self, index: int) -> tuple[float, float] | None:
        """(MiB used, MiB total) of GPU ``index``."""
        if self.vendor == "nvidia":
            rows = nvidia_smi("gpu=memory.used,memory.total")
            return (float(rows[index][0]), float(rows[index][1])) if rows and len(rows) > index else None
        found = release.vram(self.kfd[index : index + 1])
        return next(((u / 2**20, t / 2**20) for u, t in found.values()), None)

    def holders(self) -> set[int] | None:
        """The pids holding a GPU (None: not readable; a container may hide them from nvidia-smi)."""
        if self.vendor == "nvidia":
            rows = nvidia_smi("compute-apps=pid")
            return None if rows is None else {int(r[0]) for r in rows if r and r[0].isdigit()}
        return release.kfd_pids()


# the run's context ---------------------------------------------------------------------------------------------
class Acceptance:
    def __init__(self, a, report_dir: Path, work: Path):
        self.a, self.dry, self.work = a, a.dry_run, work
        self.sizes = DRY_SIZES if a.dry_run else GPU_SIZES
        self.device = a.device or ("cpu" if a.dry_run else "0")
        self.report_dir, self.logs = report_dir, report_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.corpus = report_dir / "corpus.jsonl"
        self.started, self.when = time.monotonic(), time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.deadline = self.started + a.budget
        self.sections = {n: Section(n) for n in TITLES}
        self.order: list[int] = []
        self.gpu = Gpus.find()
        self.machine = ""
        self.current: Section | None = None
        self.step_end = self.deadline
        self.data = self.small = work / "photos" / "photos.yaml"
        self.data_note = ""

    # budget and commands
    def left(self) -> float:
        """Seconds left to the current step (CutShort when none)."""
        left = min(self.step_end, self.deadline) - time.monotonic()
        if left < 3:
            raise CutShort(f"its budget of {self.current.budget:.0f} s ran out")
        return left

    def show(self, cmd, env: dict | None = None) -> str:
        text = shlex.join(str(c) for c in cmd).replace(PY, "python").replace(str(HERE.parent) + "/", "")
        text = text.replace(str(self.work), "WORK")
        return " ".join(f"{k}={v}" for k, v in (env or {}).items()) + (" " if env else "") + text

    def run(self, cmd, log: str, env: dict | None = None, timeout: float | None = None) -> Ran:
        """Run ``cmd`` (its output in ``logs/LOG``) within the step's budget; every process it made is stopped."""
        cmd = [str(c) for c in cmd]
        self.current.commands.append(self.show(cmd, env))
        path = self.logs / log
        try:
            code = run_logged(cmd, self.work, path, min(timeout or 1e9, self.left()), env=env)
        except SystemExit as e:
            if "did not finish" not in str(e):
                raise
            code = None
        return Ran(code, path.read_text(errors="replace") if path.exists() else "", path)

    def step_dir(self, n: int) -> Path:
        d = self.work / f"step{n}"
        d.mkdir(exist_ok=True)
        link = d / "photos"  # the benchmarks write their photo set under their directory: ours, already written
        if not link.exists():
            link.symlink_to(self.work / "photos")
        return d

    def rocm_yolo(self, *args) -> list[str]:
        return [PY, "-m", "rocm_yolo", "train", *[str(x) for x in args]]

    def keep(self, run: Path, prefix: str) -> None:
        """A run's records into logs/: its log, events, supervisor.json, crash and hang reports, the child's stderr."""
        paths = RunPaths(run)
        found = [paths.log, paths.events, paths.supervisor, *run.glob("crash-*.txt"), *run.glob("hang-*-stacks.txt")]
        found += list(paths.node_dir.glob("child-*.stderr")) if paths.node_dir.is_dir() else []
        for path in found:
            if path.is_file():
                shutil.copy(path, self.logs / f"{prefix}-{path.name}")

    # the report
    def write(self) -> None:
        elapsed = time.monotonic() - self.started
        s = self.sizes
        mode = (
            f"dry run (`--dry-run`): toy sizes on device `{self.device}`; its figures say nothing about speed"
            if self.dry
            else f"GPU run on device `{self.device}`"
        )
        lines = [
            "# rocm-yolo on a lent GPU: acceptance report",
            "",
            f"Command: `{self.show([PY, Path(__file__), *sys.argv[1:]])}`",
            "",
            f"Mode: {mode}. Started {self.when}; {elapsed:.0f} s of the {self.a.budget:.0f} s budget used; "
            f"steps in the order run: {', '.join(map(str, self.order)) or '-'}.",
            "",
            f"Machine: {self.machine or '(step 8 not run yet)'}",
            "",
            f"Data: {self.data_note or '(not written yet)'}; imgsz {s.imgsz}, batch {s.batch}, {s.workers} workers "
            "unless a step says otherwise. `WORK` is the work directory; `logs/` holds every command's output and "
            "the runs' records, `corpus.jsonl` step 6's failures as corpus cases.",
            "",
        ]
        for n in TITLES:
            lines += self.sections[n].render()
        tmp = self.report_dir / f".{REPORT}.tmp"
        tmp.write_text("\n".join(lines))
        os.replace(tmp, self.report_dir / REPORT)


# helpers of the steps --------------------------------------------------------------------------------------------
def failed(r: Ran, what: str) -> str:
    if r.code is None:
        return f"{what} was cut short: the step's budget ran out (log: logs/{r.log.name})"
    last = next((x.strip() for x in reversed(r.text.splitlines()) if x.strip()), "")
    return f"{what} exited with {r.code}: {last[:300]} (log: logs/{r.log.name})"


def after_rounds(text: str) -> list[str]:
    """A benchmark's report: what it printed after its last per-round line."""
    lines = text.rstrip().splitlines()
    last = max((i for i, x in enumerate(lines) if x.startswith("  round ")), default=-1)
    shown = [x for x in lines[last + 1 :] if not x.startswith(("work directory", "total "))]
    while shown and not shown[0].strip():
        shown.pop(0)
    return shown


def rounds_table(text: str, head: str) -> list[str]:
    """The per-round lines a benchmark printed before it was stopped, as a table."""
    rows = [x.strip() for x in text.splitlines() if x.startswith("  round ")]
    return [f"| {head} |", "| --- |", *(f"| {x} |" for x in rows)] if rows else ["(no round finished)"]


def state_of(run: Path):
    state = read_state(run)
    if state is None:
        raise RuntimeError(f"no readable supervisor.json in {run}")
    return state


def cell(text: str) -> str:
    """``text`` as one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def corpus_case(ctx: Acceptance, kind: str, run: Path, label: str, remedy: str, why: str) -> dict:
    """The failed attempt's stderr, kept as a case of the failure corpus (../shared/corpus/failures.jsonl)."""
    paths = RunPaths(run)
    crash = next((e for e in read_events(paths.events) if e["event"] in ("crash", "hang")), {})
    attempt = crash.get("attempt") or 1
    text = read(paths.child_stderr(attempt))
    traceback = read(paths.crash(attempt)).split("\n--- rocm-yolo diagnosis", 1)[0].strip()
    text = (text.rstrip() + "\n" + traceback if traceback and traceback not in text else text)[-8000:]
    where = (ctx.gpu.names or ["CPU"])[0]
    case = {
        "id": f"gpu-acceptance-{re.sub(r'[^a-z0-9]+', '-', where.lower()).strip('-')}-{kind}",
        "source": f"gpu_acceptance on {where}" + (" (dry run)" if ctx.dry else ""),
        "label": label,
        "failure": crash.get("event", "crash"),
        "exit": crash.get("exit_code"),
        "on_gpu": ctx.device != "cpu",
        "multi_gpu": False,
        "text": text,
        "remedy": remedy,
        "why": why,
    }
    with open(ctx.corpus, "a", encoding="utf-8") as f:
        f.write(json.dumps(case) + "\n")
    return case


def hang_so_far(run: Path, fault: str) -> str:
    """How far a hang run got, from its records: for a run cut short."""
    fired = RunPaths(run).fault_fired(fault.partition("@")[0])
    if not fired.exists():
        return "the hang had not happened yet"
    hung, evs = fired.stat().st_mtime, read_events(RunPaths(run).events)
    hang = next((e for e in evs if e["event"] == "hang"), None)
    if hang is None:
        return "the hang was not detected yet"
    detected = hang.get("detected", hang["time"])  # the event's time is when its diagnosis is said
    said = f"detected {detected - hung:.1f} s after the hang"
    restart = next((e for e in evs if e["event"] == "restart" and e["time"] >= hang["time"]), None)
    if restart is None:
        return said + ", not restarted yet"
    batch = next((e for e in evs if e["event"] == "workers" and e["time"] > restart["time"]), None)
    said += f", restarted {restart['time'] - detected:.1f} s later (stacks dumped, tree killed, diagnosed)"
    return said + (f", training again {batch['time'] - hung:.1f} s after the hang" if batch else ", no batch since")


@contextlib.contextmanager
def hang_sizes(args: list[str]):
    """bench_watchdog's hang run at these sizes: its TINY are the CPU's (imgsz 32, --device cpu)."""
    saved = bench_watchdog.TINY
    bench_watchdog.TINY = args
    try:
        yield
    finally:
        bench_watchdog.TINY = saved


HANGS = {  # step 5's hangs, in order: ROCM_YOLO_FAULT, what it does, the name of its runs and logs
    "worker-hang@1:0": ("a DataLoader worker blocks forever from epoch 1's start: the seeds' hang at 0/N", "first"),
    "worker-hang@2:1": ("a DataLoader worker blocks forever after epoch 2 batch 1", "mid"),
    "worker-hang@2:1:1": ("rank 1's DataLoader worker blocks forever after epoch 2 batch 1", "rank1"),
}


def hang_recovery(ctx: Acceptance, n: int, device: str, fault: str) -> list[str]:
    """A real worker hang (``fault``, one of HANGS) recovered by the watchdog: bench_watchdog.hang_round's
    figures, and the batches trained again from supervisor.json."""
    what, tag = HANGS[fault]
    s, root = ctx.sizes, ctx.step_dir(n) / tag
    root.mkdir(exist_ok=True)
    batch, workers = s.hang
    tiny = ["--model", "yolo26n.yaml", "--device", device, "--workers", str(workers), "--imgsz", str(s.imgsz)]
    tiny += ["--batch", str(batch), "prefetch_factor=1", "plots=False"]
    args = ["--epochs", "3", *tiny, "--stall-timeout", str(s.stall), "--startup-grace", "60"]
    ctx.current.commands.append(ctx.show(ctx.rocm_yolo(ctx.small, *args), {"ROCM_YOLO_FAULT": fault}))
    name = f"stall{s.stall:g}-r1"
    try:
        with hang_sizes(tiny):
            a = SimpleNamespace(fault=fault, timeout=ctx.left())
            out = bench_watchdog.hang_round(a, ctx.small, root, s.stall, 1)
    except SystemExit as e:
        if "did not finish" in str(e):
            so_far = hang_so_far(root / "runs" / name, fault)
            raise CutShort(
                f"the hang run did not finish in its budget; so far: {so_far} (log: logs/{n}-{tag}-hang.log)"
            ) from None
        raise RuntimeError(str(e).splitlines()[0]) from None
    finally:
        if (root / f"{name}.log").is_file():
            shutil.copy(root / f"{name}.log", ctx.logs / f"{n}-{tag}-hang.log")
        ctx.keep(root / "runs" / name, f"{n}-{tag}-hang")
    state = state_of(root / "runs" / name)
    rec = state.recoveries[0] if state.recoveries else None
    cls = state.failures[0].cls if state.failures else "-"
    resumed = Path(rec.checkpoint).name if rec and rec.checkpoint else "-"

    def sec(x):
        return "-" if x is None else f"{x:.1f}"

    return [
        f"`ROCM_YOLO_FAULT={fault}` ({what}), `--stall-timeout "
        f"{s.stall}`, {s.small} train images, batch {batch}, {workers} workers; seconds:",
        "",
        "| hang → detected | detected → restarted (stacks dumped, tree killed, diagnosed) | restarted → first batch "
        "| hang → training again "
        "| batches trained again | class | resumed from |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {sec(out['detect'])} | {sec(out['restart'])} | {sec(out['first_batch'])} | {sec(out['total'])} "
        f"| {rec.retrained_batches if rec else '-'} | {cls} | {resumed} |",
    ]


# the steps ---------------------------------------------------------------------------------------------------------
def step_machine(ctx: Acceptance, sec: Section) -> None:
    build, g = torch_build(), ctx.gpu
    runtime = f"ROCm {build['hip']}" if build["hip"] else f"CUDA {build['cuda']}" if build["cuda"] else "CPU only"
    gpus = "; ".join(g.names) or "none visible (nvidia-smi, /sys/class/kfd)"
    cpu = machine_line()
    ctx.machine = f"GPU {gpus}, driver {g.driver or '-'}; torch {build['torch']} ({runtime} build); {cpu}"
    sec.body = [
        "| GPU | driver | torch | ROCm / CUDA | Ultralytics | cores |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {gpus} | {g.driver or '-'} | {build['torch']} | {runtime} | {version('ultralytics')} | {os.cpu_count()} |",
        f"In full: {cpu}",
    ]


def step_first_batch(ctx: Acceptance, sec: Section) -> None:
    s, d = ctx.sizes, ctx.step_dir(1)
    workers, batches = s.loader
    cmd = [PY, HERE / "bench_loader.py", "--workers", workers, "--methods", "fork,forkserver", "--rounds", 1]
    cmd += ["--images", s.train, "--imgsz", s.imgsz, "--batch", s.batch, "--batches", batches, "--real", "--keep", d]
    r = ctx.run([*cmd, "--timeout", int(ctx.left())], "1-first-batch.log")
    if r.code != 0:
        sec.body = rounds_table(r.text, "round: method x workers: first batch (from process start)")
        raise RuntimeError(failed(r, "bench_loader.py"))
    sec.body = [
        "`fork` is plain Ultralytics (workers forked from the trainer), `forkserver` rocm-yolo's `fast` (workers "
        "from the preloaded fork server); seconds from `iter(loader)` to the first batch (from the process start):",
        "",
        *after_rounds(r.text),
    ]


def step_epochs(ctx: Acceptance, sec: Section) -> None:
    s, d = ctx.sizes, ctx.step_dir(2)
    cmd = [PY, HERE / "bench_train.py", "--sides", *s.sides, "--workers", s.workers, "--device", ctx.device]
    cmd += ["--data", "photos", "--train", s.train, "--val", s.val, "--imgsz", s.imgsz, "--batch", s.batch]
    cmd += ["--epochs", s.epochs, "--rounds", 1, "--dir", d, "--timeout", int(ctx.left() - 5)]
    r = ctx.run(cmd, "2-epochs.log")
    for log in d.glob("*.log"):
        shutil.copy(log, ctx.logs / f"2-{log.name}")
    note = (
        [f"Dry run: sides {', '.join(s.sides)} only (fewest processes); the GPU run has all six.", ""]
        if ctx.dry
        else []
    )
    if r.code != 0:
        sec.body = note + rounds_table(r.text, "round side: wall, epoch times (s)")
        raise RuntimeError(failed(r, "bench_train.py"))
    shown = after_rounds(r.text)
    start = next((i for i, x in enumerate(shown) if x.startswith("Settings:")), 0)
    sec.body = note + shown[start:]


def conv_auto(device: str, timeout: float) -> tuple[str, str]:
    """What ``--conv auto`` resolves to on this machine, as the training child resolves it (its header's line): on
    ROCm the self-test, whose result is cached for the later runs (the same key: the amp the presets leave)."""
    from rocm_yolo.conv.selftest import resolve_strategy
    from rocm_yolo.gpu.arch import detect_arch
    from rocm_yolo.gpu.presets import presets

    arch = detect_arch()
    amp = not any(p.key == "amp" and p.value is False for p in presets(arch, {}, os.environ))
    return resolve_strategy("auto", arch, device=device, timeout=timeout, amp=amp)


SELFTEST_ROW = re.compile(r"^(\S+)\s+(?:ok\s+([\d.]+) ms/step\s+max rel err (\S+)|FAIL (.*))$")


def step_conv(ctx: Acceptance, sec: Section) -> None:
    """What a training run's ``--conv auto`` resolves to here (on ROCm: the self-test, cached for the later steps'
    runs), and where that takes no timing (no AMD GPU), the self-test's own timings."""
    device = "cpu" if ctx.device == "cpu" else "cuda"
    r = ctx.run([PY, Path(__file__), "--conv-auto", device, "--budget", int(ctx.left() - 5)], "3-conv-auto.log")
    found = next((x for x in r.text.splitlines() if x.startswith("conv: ")), None)
    if r.code != 0 or found is None:
        raise RuntimeError(failed(r, "resolve_strategy('auto')"))
    said = found[len("conv: ") :]
    sec.body = [f"`--conv auto` here, as a training run's header says it: `conv: {said}`", ""]
    if "(auto:" not in said:  # ROCm: the self-test ran, its timings are in the line
        return
    cmd = [PY, "-m", "rocm_yolo.conv.selftest", "--device", device, "--timeout", int(ctx.left() - 5)]
    r = ctx.run([*cmd, *ctx.sizes.conv], "3-conv-selftest.log")
    rows = [m for m in map(SELFTEST_ROW.match, r.text.splitlines()) if m]
    auto = next((x for x in r.text.splitlines() if x.startswith("auto: ")), None)
    if not rows:
        raise RuntimeError(failed(r, "the conv self-test"))
    sec.body += [
        "So no self-test runs in training here. The self-test itself (`python -m rocm_yolo.conv.selftest`: each "
        "strategy checked against a float64 reference, then a training step timed), as it would run on ROCm:",
        "",
        "| strategy | result | ms per training step | max relative error |",
        "| --- | --- | --- | --- |",
        *(f"| {m[1]} | {'ok' if m[2] else 'failed: ' + m[4]} | {m[2] or '-'} | {m[3] or '-'} |" for m in rows),
        "",
        f"The pick by timing: `{auto or 'none (the self-test printed no choice)'}`",
    ]


def step_release(ctx: Acceptance, sec: Section) -> None:
    if ctx.device == "cpu" or not ctx.gpu.vendor:
        raise Skip("needs a GPU: on the CPU no process holds GPU memory")
    s, index = ctx.sizes, int(ctx.device.split(",")[0])
    vram_before = {node: used for node, (used, _) in release.vram(ctx.gpu.kfd).items()}  # as the supervisor's
    before, total = ctx.gpu.memory(index) or (None, None)
    run = ctx.step_dir(4) / "runs" / "kill"
    cmd = ctx.rocm_yolo(ctx.small, "--model", "yolo26n.yaml", "--device", ctx.device, "--imgsz", s.imgsz)
    cmd += ["--batch", s.batch, "--workers", s.workers, "--epochs", 100, "--max-restarts", 0, "val=False"]
    cmd += ["plots=False", "--project", run.parent, "--name", run.name]
    waited: dict = {}
    try:
        with started(ctx, cmd, "4-release.log", note="then SIGKILL of its training process at its 3rd batch") as proc:
            hb = wait_training(ctx, proc, run, 3)
            if hb is None:
                raise RuntimeError(f"the run ended ({proc.returncode}) before its 3rd batch (log: logs/4-release.log)")
            holding = ctx.gpu.memory(index)
            os.kill(hb.pid, signal.SIGKILL)
            killed = time.monotonic()
            wait = threading.Thread(
                target=lambda: waited.update(r=release.wait_released([hb.pid], ctx.gpu.kfd, vram_before, 60.0)),
                daemon=True,
            )
            wait.start()
            seen = watch_release(ctx, index, hb.pid, before, total, killed)
            wait.join(timeout=max(ctx.left() - 2, 0))
    finally:
        ctx.keep(run, "4-release")
    got = waited.get("r")
    said = f"{got.seconds:.1f} s: {got.describe()}" if got else "still waiting when the step's budget ran out"
    sec.body = [
        f"A `rocm-yolo train` on GPU {index} ({s.small} images, batch {s.batch}, `--max-restarts 0`: no new attempt "
        f"takes the memory again), its training process killed with SIGKILL at its 3rd batch; the GPU polled every "
        f"{seen['poll']:.2f} s on average, `wait_released` (what the supervisor calls after a GPU fault or hang) "
        "started at the kill, for the same pid:",
        "",
        "| used before the run | used while training | pid gone from the GPU's process list | memory back within "
        f"{seen['slack']:.0f} MiB of before | `gpu.release.wait_released` |",
        "| --- | --- | --- | --- | --- |",
        f"| {mib(before)} | {mib(holding[0] if holding else None)} | {secs(seen['gone'], seen['listed'])} "
        f"| {secs(seen['freed'], True)} | {said} |",
    ]


@contextlib.contextmanager
def started(ctx: Acceptance, cmd, log: str, env: dict | None = None, note: str = ""):
    """``cmd`` running, its output in ``logs/LOG``; at the end it is stopped with every process it made."""
    cmd = [str(c) for c in cmd]
    ctx.current.commands.append(ctx.show(cmd, env) + (f"   # {note}" if note else ""))
    tagged, proc = Tagged(TAG_VAR), None
    try:
        with open(ctx.logs / log, "w") as out:
            proc = tagged.start(cmd, cwd=ctx.work, output=out, extra=env)
        yield proc
    finally:
        tagged.stop(proc)


def wait_training(ctx: Acceptance, proc, run: Path, batches: int, reserve: float = 0.0):
    """The run's heartbeat once this attempt trained ``batches`` batches; None if it ended first; CutShort when
    no more than ``reserve`` seconds of the step are left first."""
    while True:
        hb = heartbeat.read(RunPaths(run).heartbeat)
        if hb is not None and hb.phase == "train" and hb.batches_total >= batches:
            return hb
        if proc.poll() is not None:
            return None
        if ctx.left() < reserve:
            raise CutShort(f"the run had not trained {batches} batches when the time it was given ran out")
        time.sleep(0.2)


def mib(x) -> str:
    return "-" if x is None else f"{x:,.0f} MiB"


def secs(x, known=True) -> str:
    if not known:
        return "never listed (hidden from this container?)"
    return "not within 60 s" if x is None else f"{x:.2f} s"


def watch_release(ctx: Acceptance, index: int, pid: int, before, total, killed: float) -> dict:
    """Poll the GPU after the kill: seconds until ``pid`` is no longer listed and until memory is back near
    ``before`` (the slack of rocm_yolo.gpu.release: 256 MiB or 2% of the card)."""
    slack = max(release.SLACK_BYTES / 2**20, (total or 0) / 50)
    gone = freed = None
    listed, polls = False, 0
    while time.monotonic() - killed < 60 and (gone is None or freed is None):
        if ctx.left() < 5:
            break
        holders, used = ctx.gpu.holders(), ctx.gpu.memory(index)
        now, polls = time.monotonic() - killed, polls + 1
        listed = listed or (holders is not None and pid in holders)
        if gone is None and holders is not None and pid not in holders:
            gone = now
        if freed is None and used is not None and before is not None and used[0] <= before + slack:
            freed = now
        time.sleep(0.05)
    elapsed = time.monotonic() - killed
    return {"gone": gone, "freed": freed, "listed": listed or gone, "slack": slack, "poll": elapsed / max(polls, 1)}


def step_failures(ctx: Acceptance, sec: Section) -> None:
    sec.body = ["### Out of memory", ""]
    if ctx.device == "cpu":
        sec.body += ["Status: skipped: needs a GPU (a CPU has no device memory to run out of)", ""]
    else:
        try:
            sec.body += out_of_memory(ctx, reserve=35)
        except (CutShort, RuntimeError) as e:
            sec.body += [f"Status: {'cut short' if isinstance(e, CutShort) else 'failed'}: {e}", ""]
    sec.body += ["### Device-side assert", "", *device_assert(ctx)]


def out_of_memory(ctx: Acceptance, reserve: float) -> list[str]:
    """A batch far too large, on the GPU: the class and the advice; then whether the advised batch trains."""
    s, root = ctx.sizes, ctx.step_dir(6) / "runs"
    model, imgsz, batch = s.oom
    args = [ctx.data, "--model", model, "--device", ctx.device, "--imgsz", imgsz, *OOM_ARGS, "--epochs", 1]
    args += ["val=False", "plots=False", "--project", root]
    r = ctx.run(ctx.rocm_yolo(*args, "--batch", batch, "--name", "oom"), "6-oom.log", timeout=ctx.left() - reserve)
    ctx.keep(root / "oom", "6-oom")
    if r.code is None:
        raise CutShort(failed(r, "the out-of-memory run"))
    state = read_state(root / "oom")
    fail = state.failures[0] if state and state.failures else None
    verdict = " ".join(state.verdict or []) if state else ""
    advised = re.search(r"try --batch (\d+)", verdict)
    cls, title = (fail.cls, fail.title) if fail else ("-", "no failure recorded")
    lines = [
        f"`{model}`, imgsz {imgsz}, on {s.train} images, `{' '.join(OOM_ARGS)}`, `--epochs 1`:",
        "",
        "| batch | exit | class | rocm-yolo's title | Ultralytics' own retries first | rocm-yolo's verdict |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {batch} | {r.code} | {cls} | {cell(title)} | {halvings(r.text)} | {cell(verdict or '-')} |",
        "",
    ]
    if fail:
        why = f"{model} at imgsz {imgsz} and batch {batch}: far more than the card's memory"
        corpus_case(ctx, "oom", root / "oom", "gpu-oom", f"the advice: {verdict or '-'}", why)
    if not advised:
        return lines + ["No smaller batch advised: no run at it.", ""]
    cmd = ctx.rocm_yolo(*args, "--batch", advised[1], "--name", "advised")
    try:
        with started(ctx, cmd, "6-oom-advised.log", note="stopped after 3 training batches") as proc:
            hb = wait_training(ctx, proc, root / "advised", 3, reserve)
            code = proc.poll()
    finally:
        ctx.keep(root / "advised", "6-oom-advised")
    said = read(ctx.logs / "6-oom-advised.log")
    reduced = re.findall(r"Reducing to batch=(\d+)", said)
    at = f" at batch {reduced[-1]}, after Ultralytics' own halving (the advised batch ran out of memory too)"
    trains = (
        "trains" + (at if reduced else "") + ": 3 batches done, stopped there"
        if hb
        else "trains: its epoch ended before a 3rd batch (exit 0)"
        if code == 0
        else f"does not train: exit {code}"
    )
    return lines + [
        f"At the advised `--batch {advised[1]}`: it {trains}; Ultralytics' own retries: {halvings(said)}.",
        "",
    ]


def halvings(log: str) -> str:
    """What Ultralytics did about out-of-memory errors in its first epoch (it halves the batch, 3 times at most)."""
    found = re.findall(r"with batch=(\d+)\. Reducing to batch=(\d+)", log)
    return ", ".join(f"{a} → {b}" for a, b in found) or "none"


def device_assert(ctx: Acceptance) -> list[str]:
    s, root = ctx.sizes, ctx.step_dir(6) / "runs"
    fault = "device-assert@1:2"
    run = root / "assert"
    cmd = ctx.rocm_yolo(ctx.small, "--model", "yolo26n.yaml", "--device", ctx.device, "--imgsz", s.imgsz, "--batch",
                        s.batch, "--workers", s.workers, "--epochs", 1, "--max-restarts", 0, "val=False",
                        "plots=False", "--project", root, "--name", "assert")  # fmt: skip
    r = ctx.run(cmd, "6-assert.log", env={"ROCM_YOLO_FAULT": fault})
    ctx.keep(run, "6-assert")
    if r.code is None:
        raise CutShort(failed(r, "the device-assert run"))
    state = read_state(run)
    fail = state.failures[0] if state and state.failures else None
    if fail is None:
        raise RuntimeError(failed(r, "the device-assert run") + ": no failure recorded")
    where = {"nvidia": "a device-side assert", "amd": "a read far out of range (ROCm's torch has kernel asserts off)"}
    where = "an IndexError on the CPU" if ctx.device == "cpu" else where.get(ctx.gpu.vendor, "on the GPU")
    corpus_case(ctx, "device-assert", run, "training-error", "fix the index: a class id of the labels beyond the "
                "model's classes (nothing to retry)", f"ROCM_YOLO_FAULT={fault}: F.cross_entropy with a target out of "
                f"range on device {ctx.device}: {where}")  # fmt: skip
    return [
        f"`ROCM_YOLO_FAULT={fault}`: a loss with a class index far out of range on the training device, "
        "`--max-restarts 0` (the class is the finding, not the restart):",
        "",
        "| what failed | exit | class | rocm-yolo's title | remedy |",
        "| --- | --- | --- | --- | --- |",
        f"| {where} | {r.code} | {fail.cls} | {cell(fail.title)} | {fail.remedy or '-'} |",
        "",
        "Each failure's stderr and traceback is a case in `corpus.jsonl`.",
    ]


def step_hang(ctx: Acceptance, sec: Section) -> None:
    first = None  # the first hang's failure: the step's status, once the other hang had its turn
    faults = ("worker-hang@2:1", "worker-hang@1:0")  # issue 33's hang first; the seeds' one with the time left
    if ctx.dry:  # the two hangs take the same path through the script: not twice on a test's clock
        faults = faults[1:]
        sec.body += ["Dry run: the hang before the first batch only; the GPU run has the mid-run one too.", ""]
    for fault in faults:
        what = HANGS[fault][0]
        sec.body += [f"### {what[0].upper()}{what[1:]}", ""]
        try:
            sec.body += [*hang_recovery(ctx, 5, ctx.device, fault), ""]
        except (CutShort, RuntimeError) as e:
            sec.body += [f"Status: {'cut short' if isinstance(e, CutShort) else 'failed'}: {e}", ""]
            first = first or e
    if first is not None:
        raise first


def step_ddp(ctx: Acceptance, sec: Section) -> None:
    count = len(ctx.gpu.names)
    if ctx.device == "cpu" or count < 2:
        raise Skip(f"needs two or more GPUs; this machine shows {count} (on CPU ranks: bench_ddp.py, the e2e tests)")
    s, d = ctx.sizes, ctx.step_dir(7)
    devices = ctx.device if "," in ctx.device else "0,1"
    cmd = [PY, HERE / "bench_ddp.py", "--device", devices, "--no-cpu", "--workers", min(s.workers, 4)]
    cmd += ["--rounds", 1, "--epochs", 3, "--imgsz", s.imgsz, "--batch", 2 * s.batch, "--train", s.train, "--dir", d]
    r = ctx.run([*cmd, "--timeout", int(ctx.left() - 60)], "7-ddp.log", timeout=ctx.left() - 60)
    sec.body = ["### DDP against plain Ultralytics' DDP", ""]
    sec.body += after_rounds(r.text) if r.code == 0 else [f"Status: failed: {failed(r, 'bench_ddp.py')}"]
    sec.body += ["", "### Rank 1's worker hang", "", *hang_recovery(ctx, 7, devices, "worker-hang@2:1:1")]


STEPS = {1: step_first_batch, 2: step_epochs, 3: step_conv, 4: step_release, 5: step_hang, 6: step_failures}
STEPS.update({7: step_ddp, 8: step_machine})


def run_step(ctx: Acceptance, n: int) -> None:
    sec = ctx.current = ctx.sections[n]
    left = ctx.deadline - time.monotonic()
    if ctx.a.steps and n not in ctx.a.steps and n != 8:  # the machine line always
        sec.status = "skipped: not asked for (--steps)"
        return
    if left < MIN_STEP:
        sec.status = f"not reached: {left:.0f} s of the {ctx.a.budget:.0f} s budget were left"
        return
    ctx.order.append(n)
    sec.budget = min(BUDGET[n] * (4 if ctx.dry else 1), left)
    ctx.step_end = time.monotonic() + sec.budget
    sec.status = "running"
    ctx.write()
    t0 = time.monotonic()
    print(f"step {n}: {TITLES[n]}", flush=True)
    try:
        STEPS[n](ctx, sec)
        sec.status = "done"
    except Skip as e:
        sec.status, sec.budget = f"skipped: {e}", None
    except CutShort as e:
        sec.status = f"cut short: {e}"
    except KeyboardInterrupt:
        sec.status = "interrupted (a signal stopped the script; every process of the step is stopped)"
        raise
    except Exception as e:  # noqa: BLE001 - one step's failure is a finding: the others run
        sec.status = f"failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    finally:
        sec.seconds = None if sec.status.startswith("skipped") else time.monotonic() - t0
        ctx.write()
        print(f"step {n}: {sec.status}", flush=True)


def prepare_data(ctx: Acceptance) -> None:
    s, t0 = ctx.sizes, time.monotonic()
    ctx.data = write_photo_set(ctx.work / "photos", train=s.train, val=s.val)
    ctx.small = ctx.data
    if s.small < s.train:  # the first images of the set, listed in a text file Ultralytics reads as a split
        images = sorted((ctx.work / "photos" / "images" / "train").glob("*.jpg"))[: s.small]
        (ctx.work / "photos" / "train-small.txt").write_text("".join(f"{p}\n" for p in images))
        ctx.small = ctx.work / "photos" / "small.yaml"
        text = ctx.data.read_text().replace("train: images/train", "train: train-small.txt")
        ctx.small.write_text(text)
    ctx.data_note = (
        f"{s.train} train and {s.val} val real-photo 640x480 JPEGs (benchmarks/_photos.py, written in "
        f"{time.monotonic() - t0:.1f} s); the small set: the first {s.small} of them"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "report_dir", type=Path, nargs="?", help="where the report, its logs and corpus cases go (made if missing)"
    )
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU; what needs a GPU is skipped")
    p.add_argument("--device", help="the GPU(s) of the runs (default: 0; with --dry-run: cpu)")
    p.add_argument("--budget", type=float, help="seconds for all the steps (default: 480; with --dry-run: 900)")
    p.add_argument("--steps", type=lambda x: {int(n) for n in x.split(",")}, help="only these steps, e.g. 2,5")
    p.add_argument("--dir", type=Path, help="work directory for the data and runs, kept (default: temporary, removed)")
    p.add_argument("--conv-auto", metavar="DEVICE", help=argparse.SUPPRESS)  # step 3's child: print the line
    a = p.parse_args(argv)
    a.budget = a.budget or (900.0 if a.dry_run else 480.0)
    if a.conv_auto:
        print(f"conv: {conv_auto(a.conv_auto, a.budget)[1]}")
        return 0
    if a.report_dir is None:
        p.error("give REPORT_DIR: where the report goes")
    stop_on_signals()
    a.report_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        work = a.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-acceptance-")))
        work.mkdir(parents=True, exist_ok=True)
        ctx = Acceptance(a, a.report_dir.resolve(), work.resolve())
        if ctx.device != "cpu" and not ctx.gpu.vendor:
            p.error("no GPU visible (nvidia-smi, /sys/class/kfd): give --dry-run, or --device cpu")
        try:
            try:
                prepare_data(ctx)
            except Exception as e:  # noqa: BLE001 - said in the report, as a step's failure would be
                ctx.data_note = f"could not be written: {type(e).__name__}: {e}"
                ctx.write()
                print(f"the data set could not be written: {e}", file=sys.stderr)
                return 1
            for n in ORDER:
                run_step(ctx, n)
            ctx.write()
        except KeyboardInterrupt:
            for sec in ctx.sections.values():
                sec.status = "not reached: the script was stopped" if sec.status == "not run yet" else sec.status
            ctx.write()
            print(f"interrupted: the report so far is in {ctx.report_dir / REPORT}", file=sys.stderr)
            return 130
    print(f"report: {ctx.report_dir / REPORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
