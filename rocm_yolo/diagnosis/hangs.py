"""Where a hung run is stuck, read from its stacks (``RUN/hang-K-stacks.txt``, written by
:func:`rocm_yolo.process.tree.dump_stacks`) and from the kernel's view of its threads
(:func:`rocm_yolo.process.kernel_view.threads`).

The trainer (or a rank) waiting for a batch in the DataLoader is a loader hang; every rank waiting in a collective
is a collective hang; on a GPU, the trainer stuck inside a torch operation (or py-spy's native frames in the HIP
runtime) is a GPU hang; on several GPUs the rank stuck outside torch is the one the others wait for. Where the stacks
show only the training loop's outer frames, or no Python frame, the kernel still knows where the trainer's main
thread waits: in an ioctl on a GPU driver's device (``/dev/kfd``: libhsakmt's ``hsaKmtWaitOnEvent``; amdgpu's or
NVIDIA's), a GPU that stopped answering; in a ``futex`` while the attempt's DataLoader workers are gone, a queue
nobody will fill: the loader. A hang's own output that holds its main thread's native frames (py-spy's, gdb's) in
ROCr's signal wait is a GPU hang too (:func:`from_native`, the words of :data:`.vocabulary.WAITS`). Pure.
"""

from __future__ import annotations

import re

from rocm_yolo.diagnosis import vocabulary
from rocm_yolo.diagnosis.classes import COLLECTIVE, GPU_HANG, LOADER, UNKNOWN
from rocm_yolo.diagnosis.record import Diagnosis
from rocm_yolo.process.kernel_view import STOPPED, ThreadView

_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+ in (\S+)')
_SECTION = re.compile(r"^===== pid (\d+) \((\w+), [^)]*\)", re.M)
_STOPPED = re.compile(r"^===== pid (\d+) \((\w+), (?:stopped|tracing-stop)\)", re.M)  # psutil's status names
# py-spy --native: a thread in the HIP runtime (ROCr's C++ frames are in its namespace rocr::, ROCR-Runtime core/)
_HIP_NATIVE = re.compile(r"\b(hip[A-Z]\w+|hsa_\w+|hsaKmt\w+|rocr::[\w:]+)")
_THREAD_HEAD = re.compile(r"^Thread \S+[^\n]*$", re.M)  # py-spy's "Thread 0x7f.. (idle): "MainThread"", gdb's
_COLLECTIVES = re.compile(r"^(all_reduce|barrier|broadcast|all_gather\w*|reduce_scatter\w*|reduce|wait|backward)$")
THREADS_WHY = (
    "the kernel's view of the trainer's main thread (/proc/PID/task/TID: stat, wchan, syscall; Linux "
    "Documentation/filesystems/proc.rst)"
)
_PY_SPY_RAN = "--- py-spy dump --native (exit 0)"  # tree.dump_stacks's heading of a dump py-spy made


def why(stacks: str) -> str:
    """What the stacks were read with, as far as it was used: faulthandler where a process wrote its threads, py-spy
    where it was installed and dumped a process (never a tool that was not there or did not answer)."""
    used = [
        tool
        for tool, ran in (
            ("faulthandler", any(threads(text) for _, _, text in sections(stacks))),
            ("py-spy", _PY_SPY_RAN in stacks),
        )
        if ran
    ]
    return f"the stacks of the hung processes ({', '.join(used)})" if used else "the hung processes as listed"


def sections(stacks: str) -> list[tuple[int, str, str]]:
    """(pid, role, text) of each process of a stacks file (:func:`rocm_yolo.process.tree.dump_stacks`)."""
    marks = list(_SECTION.finditer(stacks))
    return [
        (int(m[1]), m[2], stacks[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(stacks)])
        for i, m in enumerate(marks)
    ]


def threads(text: str) -> list[list[tuple[str, str]]]:
    """Each faulthandler thread block of ``text`` as its frames (file, function), innermost first."""
    out: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if re.match(r"^(Current thread|Thread) 0x", line):
            out.append([])
        elif out:
            m = _FRAME.match(line)
            if m:
                out[-1].append((m[1], m[2]))
    return [t for t in out if t]


def main_thread(text: str) -> list[tuple[str, str]]:
    """The main thread's frames (its outermost frame is not threading's ``_bootstrap``), innermost first."""
    blocks = threads(text)
    main = [t for t in blocks if t[-1][1] != "_bootstrap"]
    return (main or blocks or [[]])[0]


def _waits_for_data(frames) -> bool:
    return any(
        "torch/utils/data/" in f or f.endswith(("patches/loaders/threads.py", "patches/loaders/dataloader.py"))
        for f, _ in frames
    )


def _in_collective(frames) -> bool:
    return any("torch/distributed/" in f or (_COLLECTIVES.match(fn) and "torch/" in f) for f, fn in frames)


def _in_torch(frames) -> bool:
    inner = [f for f, _ in frames[:3]]
    return any("/torch/" in f and "torch/utils/data/" not in f for f in inner)


def _py_spy(text: str) -> str:
    """The main thread of a section's ``py-spy dump --native`` (where it ran), or ''."""
    dump = text.split("--- py-spy dump --native", 1)[1] if "--- py-spy dump --native" in text else ""
    return dump.split("\nThread ", 2)[1] if dump.count("\nThread ") else dump


def where(frames) -> str:
    return f"{frames[0][1]} ({frames[0][0].rsplit('/', 2)[-1]})" if frames else "no Python stack"


def _d(cls: str, title: str, signature: str, evidence: tuple[str, ...], read: str) -> Diagnosis:
    return Diagnosis(cls, title, signature, evidence, why=read)


def from_stacks(stacks: str, *, multi_gpu: bool, on_gpu: bool) -> Diagnosis | None:
    """What the stacks of a hang say, or None when they name no place (none read, or stuck nowhere known)."""
    stopped = _STOPPED.findall(stacks)
    if stopped:  # SIGSTOP from outside (not the supervisor's Ctrl-Z, which pauses the watch): no failure of its own
        named = ", ".join(f"{role} pid {pid}" for pid, role in stopped[:4])
        title = f"hang: a process of the run was stopped by a signal (SIGSTOP or SIGTSTP from outside: {named})"
        return Diagnosis(UNKNOWN, title, "", (title,), why="the processes' states when the stacks were read")
    parts = sections(stacks)
    read = why(stacks)
    trainers = [(pid, text) for pid, role, text in parts if role in ("trainer", "rank")]
    ranks = [(pid, text) for pid, role, text in parts if role == "rank"]
    mains = {pid: main_thread(text) for pid, text in (ranks or trainers)}
    for pid, frames in mains.items():
        if _waits_for_data(frames):
            stuck = [f"pid {p}: {where(main_thread(t))}" for p, role, t in parts if role == "worker"]
            return _d(
                LOADER,
                "DataLoader hang (the trainer waits for a batch that never comes)",
                f"{LOADER}: hang in {frames[0][1]}",
                (f"trainer pid {pid} waits in {where(frames)}", *(f"worker {s}" for s in stuck[:4])),
                read,
            )
    if multi_gpu and len(ranks) > 1 and all(_in_collective(f) for f in mains.values()):
        return _d(
            COLLECTIVE,
            "collective hang between the GPUs (every rank waits in a collective)",
            f"{COLLECTIVE}: hang",
            tuple(f"rank pid {pid} waits in {where(f)}" for pid, f in mains.items()),
            read,
        )
    outside = [pid for pid, f in mains.items() if not _in_torch(f) and not _in_collective(f)]
    if len(ranks) > 1 and 0 < len(outside) < len(mains):  # one rank stuck in Python: the others wait for it
        return rank_stuck(mains, read)
    stuck = {pid: f for pid, f in mains.items() if _in_torch(f)}
    if on_gpu and stuck:
        pid, frames = next(iter(stuck.items()))
        return _d(
            GPU_HANG,
            f"main-process hang inside GPU work (in {frames[0][1]})",
            f"{GPU_HANG}: stuck in {frames[0][1]}",
            (f"trainer pid {pid} stuck in {where(frames)}",),
            read,
        )
    native = [(pid, m[0]) for pid, text in trainers for m in [_HIP_NATIVE.search(_py_spy(text))] if m]
    if on_gpu and native:
        pid, call = native[0]
        title = f"main-process hang inside GPU work (in {call})"
        return _d(GPU_HANG, title, f"{GPU_HANG}: stuck in {call}", (f"pid {pid}",), read)
    if len(ranks) > 1:
        return rank_stuck(mains, read)
    return None


_TRACE_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)', re.M)


def from_traceback(text: str) -> Diagnosis | None:
    """A hang with no stacks of its own, whose output holds the trainer's Python traceback (an interrupt's):
    waiting in the DataLoader is a loader hang."""
    frames = [(f, fn) for f, fn in _TRACE_FRAME.findall(text)][::-1]  # innermost first, as the stacks read
    if frames and _waits_for_data(frames):
        return _d(
            LOADER,
            "DataLoader hang (the trainer waits for a batch that never comes)",
            f"{LOADER}: hang in {frames[0][1]}",
            (f"the trainer waits in {where(frames)}",),
            "the trainer's traceback",
        )
    return None


def main_block(text: str) -> str:
    """Of a native dump's threads (py-spy's, gdb's "Thread N" blocks), the main thread's: the one py-spy names
    MainThread, else the first; the whole text where it names no thread."""
    heads = list(_THREAD_HEAD.finditer(text))
    if not heads:
        return text
    blocks = [text[m.start() : heads[i + 1].start() if i + 1 < len(heads) else len(text)] for i, m in enumerate(heads)]
    return next((b for b in blocks if '"MainThread"' in b.split("\n", 1)[0]), blocks[0])


def from_native(text: str) -> Diagnosis | None:
    """A hang whose output holds the native frames of its main thread (py-spy --native's, gdb's) waiting in the GPU
    runtime's signal wait (:data:`.vocabulary.WAITS`): the GPU never set the signal. None otherwise."""
    found = vocabulary.first(main_block(text), vocabulary.WAITS)
    if found is None:
        return None
    word, line = found
    title = f"GPU hang: the main thread waits for the GPU's signal ({line[:120]})"
    why = f"{word.name} ({word.meaning}): {word.source}"
    return Diagnosis(GPU_HANG, title, f"{GPU_HANG}: waits for a signal", (line,), why=why)


def rank_stuck(mains: dict, read: str) -> Diagnosis:
    """On several GPUs: the rank stuck outside torch and its collectives is the one the others wait for."""
    outside = ((p, f) for p, f in mains.items() if not _in_torch(f) and not _in_collective(f))
    pid, frames = next(
        outside, next(((p, f) for p, f in mains.items() if not _in_collective(f)), next(iter(mains.items())))
    )
    title = f"hang (rank pid {pid} in {where(frames)}; the other ranks wait for it)"
    return _d(UNKNOWN, title, f"{UNKNOWN}: hang in {frames[0][1] if frames else '?'}", (title,), read)


def _mains(threads: tuple[ThreadView, ...]) -> list[ThreadView]:
    """The main threads of the trainer, or of the ranks (the DDP launcher's own waits on them)."""
    ranks = [t for t in threads if t.main and t.role == "rank"]
    return ranks or [t for t in threads if t.main and t.role == "trainer"]


def from_threads(threads: tuple[ThreadView, ...], workers: tuple[int, ...] = ()) -> Diagnosis | None:
    """What the kernel's view of the threads says: the trainer's (or a rank's) main thread in a GPU driver is a GPU
    hang; in a futex while every DataLoader worker of the attempt is gone, the loader; None otherwise (a process
    stopped by a signal is no wait of its own)."""
    mains = _mains(threads)
    if not mains or any(t.state in STOPPED for t in mains):
        return None
    gpu = next((t for t in mains if t.on_gpu), None)
    if gpu is not None:
        waits = f"{gpu.syscall} on {gpu.fd}" if gpu.fd else f"wchan {gpu.wchan}"
        title = f"GPU hang: the {gpu.role}'s main thread waits in the GPU driver ({waits}): the GPU stopped answering"
        signature = f"{GPU_HANG}: waits in the driver ({gpu.fd.rstrip('0123456789') or gpu.wchan})"
        return Diagnosis(GPU_HANG, title, signature, (gpu.line(),), why=THREADS_WHY)
    alive = {t.pid for t in threads if t.pid in workers and t.state != "Z"}
    futex = next((t for t in mains if t.syscall == "futex"), None)
    if futex is not None and workers and not alive:
        gone = ", ".join(map(str, workers[:8]))
        title = f"DataLoader hang: the {futex.role} waits on a queue (futex) whose workers are gone (pids {gone})"
        evidence = (futex.line(), f"DataLoader workers of the attempt, none alive: {gone}")
        return Diagnosis(LOADER, title, f"{LOADER}: hang, workers gone", evidence, why=THREADS_WHY)
    return None


def nowhere(stacks: str, threads: tuple[ThreadView, ...] = ()) -> Diagnosis:
    """A hang the stacks place nowhere known: where the trainer was, as a title (and where the kernel says its main
    thread waits)."""
    parts = sections(stacks)
    mains = [main_thread(text) for _, role, text in parts if role in ("trainer", "rank")]
    frames = mains[0] if mains else []
    kernel = next(iter(_mains(threads)), None)
    waits = f"; the kernel: {kernel.line()}" if kernel else ""
    title = f"hang (the trainer in {where(frames)}{waits})"
    return _d(UNKNOWN, title, f"{UNKNOWN}: hang in {frames[0][1]}" if frames else "", (title,), why(stacks))
