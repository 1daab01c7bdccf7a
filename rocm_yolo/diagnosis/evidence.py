"""What the supervisor reads about a failure and the machine it ran on: the mechanism behind :mod:`.diagnose`.

:func:`gather` collects one failure's :class:`~rocm_yolo.supervisor.diagnosis.Evidence`: the child's exit status,
the tail of its stderr, the traceback(s) it wrote (``RUN/crash-K.txt``, a rank's ``crash-K-rankN.txt``), the
stacks of a hang (``RUN/hang-K-stacks.txt``), the kernel log's amdgpu and OOM-killer lines of the attempt's time
window (:mod:`rocm_yolo.gpu.kernel_log`; a file instead of the system's log when the config names one: tests),
and the run's pids (the processes of its tree, its DataLoader workers, every process that registered a stack
file); and what a person would look at beyond the failure's text (:mod:`.sources`): the OOM kills the run's
memory cgroup counted during the attempt and its limit, the kernel's view of a hung tree's threads, the labels
against the data set's ``nc`` after an index error, the ``HSA_OVERRIDE_GFX_VERSION`` against each card.
:func:`write_report` adds the diagnosis and its evidence, each with its source, to the failure's report file, and
:class:`Machine` holds what the remedies need to know of the machine: its GPUs, their VRAM use before the run, the
kernel.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rocm_yolo.diagnosis import sources
from rocm_yolo.diagnosis.beyond import asks_labels, wrong_overrides
from rocm_yolo.diagnosis.diagnose import root_cause
from rocm_yolo.diagnosis.record import Diagnosis, Evidence
from rocm_yolo.diagnosis.remedies import Context
from rocm_yolo.gpu import kernel_log, release
from rocm_yolo.gpu.arch import GpuNode, architectures, detect_gpus
from rocm_yolo.gpu.count import used_gpus
from rocm_yolo.process.cgroup import CgroupMemory
from rocm_yolo.process.kernel_view import ThreadView
from rocm_yolo.run.atomic import REPORT_FILE, open_append
from rocm_yolo.run.devices import gpu_ids, world_size
from rocm_yolo.run.events import foreign, read_events
from rocm_yolo.run.heartbeat import Heartbeat
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import RunSpec
from rocm_yolo.run.supervisor_state import Failure
from rocm_yolo.ultralytics_rules import config as ucfg

MARGIN = 5.0  # seconds after an attempt's end: the clocks of the kernel's log and ours differ a little
KERNEL_LINES = 50  # at most this many of the window's lines go into the evidence
REPORT_STDERR_LINES = 40
REPORT_THREADS = 40
KERNEL_LOG_TIMEOUT = 5.0  # per source (dmesg, journalctl): the restart waits for it


@dataclass
class Machine:
    """The machine as the supervisor found it before the first attempt."""

    gpus: list[GpuNode] = field(default_factory=list)
    vram_before: dict[int, int] = field(default_factory=dict)  # node -> bytes used before the run
    kernel_release: str = ""

    @classmethod
    def read(cls) -> "Machine":
        gpus = detect_gpus()
        used = {node: u for node, (u, _) in release.vram(gpus).items()}
        return cls(gpus, used, os.uname().release)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(architectures(self.gpus))


def _read(path: Path, limit: int = 200_000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def tracebacks(paths: RunPaths, attempt: int, first_rank: int | None = None) -> str:
    """The traceback(s) attempt ``attempt`` wrote: the run's ``crash-K.txt`` and each rank's ``crash-K-rankN.txt``;
    the one of ``first_rank`` (the rank that failed first) last, where the diagnosis reads the final error."""
    found = [paths.crash(attempt)] + sorted(paths.run_dir.glob(f"crash-{attempt}-rank*.txt"))
    if first_rank is not None:
        first = paths.crash(attempt, first_rank)
        found = [p for p in found if p != first] + [first]
    return "\n".join(_read(p) for p in found if p.is_file())


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d{3} ")  # logging's asctime in torchrun.log


def launcher_report(path: Path, since: float) -> str:
    """What torch's launcher logged (``RUN/rocm_yolo/torchrun.log``) from ``since`` on (wall clock)."""
    keep, out = False, []
    for line in _read(path, 2_000_000).splitlines():
        m = _STAMP.match(line)
        if m:
            try:
                keep = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) >= since - 1
            except (ValueError, OverflowError):
                keep = False
        if keep:
            out.append(line)
    return "\n".join(out)


def run_pids(paths: RunPaths, since: float = 0.0) -> set[int]:
    """The pids the run recorded from ``since`` on (wall clock): its trainers' and workers' stack files, its
    DataLoader workers. An earlier attempt's processes are not this attempt's."""
    pids = set()
    try:
        for p in paths.stacks.glob("*.txt"):
            m = re.search(r"-(\d+)$", p.stem)
            if m and p.stat().st_mtime >= since - 1:
                pids.add(int(m[1]))
    except OSError:
        pass
    return pids | set(workers(paths, since))


def workers(paths: RunPaths, since: float = 0.0) -> tuple[int, ...]:
    """The DataLoader workers the run recorded from ``since`` on (wall clock), oldest first."""
    found: list[int] = []
    for line in _read(paths.workers).splitlines():
        try:
            record = json.loads(line)
            if float(record.get("time", 0)) >= since - 1:
                found.append(int(record["pid"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class KernelWindow:
    """The kernel log's lines of an attempt's window, by whose they are (:func:`rocm_yolo.gpu.kernel_log.attribute`)."""

    run: tuple[str, ...] = ()  # of the attempt's processes, or of its cards
    unnamed: tuple[str, ...] = ()  # of no process and no card: context
    others: tuple[str, ...] = ()  # of other processes or cards: never the run's
    source: str = ""  # where the lines came from, or why there are none


def _lines(events) -> tuple[str, ...]:
    return tuple(line for event in events for line in event.lines)[-KERNEL_LINES:]


def kernel_lines(path: str | None, start: float, end: float, pids, cards) -> KernelWindow:
    """The kernel log's lines that matter from ``start`` (the attempt's child started) to ``end`` (wall clock), by
    whose they are: ``pids`` the attempt's processes, ``cards`` the PCI addresses of the cards it used."""
    log = kernel_log.read(path, timeout=KERNEL_LOG_TIMEOUT)
    if not log.readable:
        return KernelWindow(source=f"kernel log not readable ({log.source})")
    window = kernel_log.within(log.lines, start, end + MARGIN)
    found = kernel_log.attribute(kernel_log.events(window), pids, cards)
    return KernelWindow(_lines(found.run), _lines(found.unnamed), _lines(found.others), log.source)


def run_cards(spec: RunSpec, gpus: list[GpuNode]) -> list[str]:
    """The PCI addresses of the cards the run trains on (none on the CPU)."""
    device = str(spec.train_args.get("device", "") or "").strip().lower()
    ids = None if device in ("cpu", "mps") else gpu_ids(device)
    env = {**os.environ, **spec.env}
    return [g.pci_address for g in used_gpus(gpus, ids, env) if g.pci_address]


def failed_batch(paths: RunPaths, since: float) -> int | None:
    """The batch size the attempt that started at ``since`` (wall clock) trained with when it failed, as its trainer
    said (Ultralytics halves the batch itself after an out-of-memory error in the first epoch); None if it did not."""
    for record in reversed(read_events(paths.events)):
        if record.get("event") == "crash_traceback" and float(record.get("time") or 0) >= since:
            batch = record.get("batch")
            return batch if isinstance(batch, int) and not isinstance(batch, bool) else None
    return None


def gather(
    spec: RunSpec,
    failure: str,
    *,
    exit_code: int | None,
    stderr: tuple[str, str],
    stacks: Path | None,
    kernel_path: str | None,
    window: tuple[float, float],
    pids: set[int],
    gpus: list[GpuNode],
    cgroup: tuple[CgroupMemory, CgroupMemory] | None = None,
    threads: tuple[ThreadView, ...] = (),
    phase: str | None = None,
) -> Evidence:
    """One failure's evidence (``failure``: "hang" or "crash"; ``stderr``: the child's, before and since its last
    progress; ``window``: from the attempt's child start to now, wall clock; ``pids``: the attempt's tree;
    ``cgroup``: the run's cgroup at the attempt's start and end; ``threads``: a hang's, as the kernel saw them;
    ``phase``: where the attempt was, train or val: the split whose labels an index error asks to check)."""
    pids = set(pids) | run_pids(spec.paths, window[0])
    kernel = kernel_lines(kernel_path, *window, pids, run_cards(spec, gpus))
    device = str(spec.train_args.get("device", "") or "").strip().lower()
    multi = world_size(spec.train_args) > 1
    launcher = launcher_report(spec.paths.torchrun_log, window[0]) if multi and failure == "crash" else ""
    first = root_cause(launcher)
    earlier, since = stderr
    kills, limit, counted = sources.cgroup_kills(cgroup)
    found = Evidence(
        failure=failure,
        exit_code=exit_code,
        stderr=foreign(since),
        earlier=foreign(earlier),
        traceback=tracebacks(spec.paths, spec.attempt, first[0] if first else None) if failure == "crash" else "",
        stacks=_read(stacks) if stacks is not None else "",
        kernel=kernel.run,
        kernel_context=kernel.unnamed,
        kernel_others=kernel.others,
        kernel_source=kernel.source,
        pids=frozenset(pids),
        multi_gpu=multi,
        on_gpu=bool(gpus) and device not in ("cpu", "mps"),
        launcher=launcher,
        batch=failed_batch(spec.paths, window[0]) if failure == "crash" else None,
        cgroup_kills=kills,
        cgroup_limit=limit,
        cgroup_source=counted,
        threads=threads,
        workers=workers(spec.paths, window[0]),
        overrides=sources.overrides(spec, gpus),
    )
    if asks_labels(found):  # a device-side assert or an index error: the labels' class ids, as the doctor checks them
        bad, checked = sources.labels(spec, phase)
        found = replace(found, labels=bad, labels_source=checked)
    return found


def failure(
    attempt: int, kind: str, diagnosis: Diagnosis, hb: Heartbeat | None, detected: float | None, report: Path | None
) -> Failure:
    """The record of one diagnosed failure, where the run was last heard (``hb``)."""
    return Failure(
        attempt=attempt,
        kind=kind,
        cls=diagnosis.cls,
        title=diagnosis.title,
        signature=diagnosis.signature,
        epoch=hb.epoch if hb else None,
        batch=hb.batch if hb else None,
        phase=hb.phase if hb else None,
        detected=detected or time.time(),
        report=str(report) if report else None,
        evidence=list(diagnosis.evidence),
        weak=diagnosis.weak,
    )


def _section(title: str, lines, none: str) -> list[str]:
    return [title, *(f"  {line}" for line in lines or (none,))]


def _beyond(e: Evidence) -> list[str]:
    """The report's lines of the evidence beyond the failure's text, each with its source."""
    kills = "not counted" if e.cgroup_kills is None else f"{e.cgroup_kills} OOM kill(s) during the attempt"
    lines = [f"the run's memory cgroup: {kills} ({e.cgroup_source or 'not read'})"]
    if e.failure == "hang":
        shown = [t.line() for t in e.threads[:REPORT_THREADS]]
        title = "the kernel's view of each thread (/proc/PID/task/TID: stat, syscall, wchan):"
        lines += _section(title, shown, "(none read)")
    if e.labels_source:
        lines += _section(f"labels ({e.labels_source}):", e.labels, "(no class id out of range)")
    wrong = {(arch, value): runs_as for arch, value, runs_as in wrong_overrides(e.overrides)}
    said = [f"{a}: {v}" + (f" (runs it as {wrong[a, v]})" if (a, v) in wrong else "") for a, v in e.overrides]
    title = "HSA_OVERRIDE_GFX_VERSION of the cards (against the KFD topology's architecture):"
    return lines + _section(title, said, "(none set)")


def write_report(path: Path, diagnosis: Diagnosis, evidence: Evidence, where: str) -> Path | None:
    """Add the diagnosis, the lines that decided it and why, the context, the kernel's lines and the stderr's end to
    the failure's report file."""
    stderr = [x for x in evidence.stderr.splitlines() if x.strip()][-REPORT_STDERR_LINES:]
    earlier = [x for x in evidence.earlier.splitlines() if x.strip()][-REPORT_STDERR_LINES // 2 :]
    strength = (
        "weak: read from context alone (an earlier line, a kernel line of no process and no card): the remedy "
        "retries, never stops"
        if diagnosis.weak
        else "the failure's own output"
    )
    parts = [
        "",
        f"--- rocm-yolo diagnosis: {diagnosis.title} at {where}",
        f"class: {diagnosis.cls}",
        f"signature: {diagnosis.signature or '(none: nothing of its own to compare)'}",
        f"evidence ({strength}):",
        *(f"  {line}" for line in diagnosis.evidence or ("(none)",)),
        f"why: {diagnosis.why or 'no rule matched'}",
        *_section(
            f"kernel log of the attempt, its processes and cards ({evidence.kernel_source}):",
            evidence.kernel,
            "(no amdgpu or OOM-killer line)",
        ),
        *_section("kernel lines of no process and no card (context):", evidence.kernel_context, "(none)"),
        # other users' processes may be named there: their count only, never their lines
        f"kernel lines of other processes or cards (never this run's): {len(evidence.kernel_others)}",
        *_beyond(evidence),
        *_section(
            f"the training process's stderr before its last progress (context), last {len(earlier)} lines:",
            earlier,
            "(none)",
        ),
        *_section(
            f"the training process's stderr since its last progress, last {len(stderr)} lines:", stderr, "(none)"
        ),
    ]
    try:
        with open_append(path, REPORT_FILE) as f:  # 0640, never through a link
            f.write("\n".join(parts) + "\n")
        return path
    except OSError:
        return None


def context(spec: RunSpec, machine: Machine, diagnosis: Diagnosis, evidence: Evidence) -> Context:
    """The facts :func:`rocm_yolo.supervisor.remedies.decide` needs for this failure."""
    args = spec.train_args
    user = {k: (spec.conv if k == "conv" else args.get(k)) for k in spec.user_keys if k in ("amp", "conv")}
    free = release.vram_free(machine.gpus) if diagnosis.cls == "gpu-oom" else None
    memory = _host_memory(spec) if diagnosis.cls == "host-oom" else {}
    return Context(
        archs=machine.archs,
        env={**os.environ, **spec.env},
        kernel_release=machine.kernel_release,
        user_args=user,
        multi_gpu=evidence.multi_gpu,
        gpus=world_size(args),
        batch=evidence.batch or (args["batch"] if "batch" in args else _default("batch")),  # the batch that failed
        imgsz=args["imgsz"] if "imgsz" in args else _default("imgsz"),
        vram_free=free,
        kernel_kinds=frozenset(k for line in evidence.kernel for k in kernel_log.kinds(line)),
        amp=args.get("amp", True),
        memory_limit=evidence.cgroup_limit,
        **memory,
    )


def _host_memory(spec: RunSpec) -> dict:
    """What a host out of memory's advice needs: the machine's memory, the image cache's size (``cache=ram``: an
    estimate from a sample, as Ultralytics' check_cache_ram makes it), the attempt's workers and their prefetch."""
    found: dict = {"workers": spec.loader.workers, "prefetch": spec.loader.prefetch_factor or ucfg.TRAIN_PREFETCH}
    m = re.search(r"^MemTotal:\s+(\d+) kB", _read(Path("/proc/meminfo")), re.M)
    if m:
        found["memory_total"] = int(m[1]) * 1024
    imgsz = spec.train_args.get("imgsz", _default("imgsz"))
    if spec.train_args.get("cache") in (True, "ram", "True", "true") and isinstance(imgsz, int):
        try:
            from rocm_yolo.ultralytics_rules.data import cache  # cv2: only for this advice

            found["cache_bytes"] = cache.estimate(cache.split_images(spec.data, sources.task_of(spec)), imgsz).bytes
        except Exception:  # the advice goes without it (the data set moved, no cv2)
            pass
    return found


def _default(key: str) -> object:
    """Ultralytics' default for ``key`` (None if its configuration cannot be read)."""
    try:
        return ucfg.default(key)
    except Exception:
        return None
