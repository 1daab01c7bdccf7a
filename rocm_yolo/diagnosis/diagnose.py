"""What failed, read from the evidence: one class per failure, the lines that decided it, and a signature.

Policy, and pure: :func:`diagnose` reads nothing but its :class:`Evidence` (what :mod:`.evidence` gathered: the
child's exit status, the tail of its stderr, the traceback of a crash, the stacks of a hang, the kernel log's lines
of the failure's time window) and returns a :class:`Diagnosis`. The classes, first match wins:

- ``gpu-fault``: the HSA runtime's ``Memory access fault by GPU node-N ... Reason: ...``, a HIP launch failure or
  illegal address, or the kernel's amdgpu page fault (``VM_L2_PROTECTION_FAULT``) when the child died;
- ``gpu-oom``: ``HIP out of memory`` (``torch.OutOfMemoryError``);
- ``host-oom``: the kernel's OOM killer killed one of the run's processes (or Python raised ``MemoryError``);
- ``loader``: the trainer waits for a batch that never comes (its stack in the DataLoader), or a worker died
  (``DataLoader worker (pid N) exited unexpectedly``, a DataLoader timeout);
- ``collective``: on several GPUs, every rank blocked in a collective (or in DDP's backward all-reduce), or a
  collective that timed out;
- ``gpu-hang``: the runtime's ``HW Exception ... GPU Hang``, the kernel's ring timeout, GPU reset or MES that
  stopped responding, or a trainer stuck in a torch operation on a GPU;
- ``data-error``: an error raised while loading a sample (in a worker, or in Ultralytics' data code);
- ``training-error``: any other Python traceback of the training step;
- ``unknown``: nothing of the above (a kill without a word, a hang outside all of it).

The signature is what makes two failures "the same": the class and the fault's own words, with addresses and pids
taken out.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from rocm_yolo.gpu.kernel_log import kinds, victims
from rocm_yolo.process.lifecycle import signal_name

LOADER, GPU_HANG, GPU_FAULT, GPU_OOM = "loader", "gpu-hang", "gpu-fault", "gpu-oom"
HOST_OOM, COLLECTIVE, TRAINING_ERROR, DATA_ERROR, UNKNOWN = (
    "host-oom",
    "collective",
    "training-error",
    "data-error",
    "unknown",
)
CLASSES = (LOADER, GPU_HANG, GPU_FAULT, GPU_OOM, HOST_OOM, COLLECTIVE, TRAINING_ERROR, DATA_ERROR, UNKNOWN)
GPU_CLASSES = (GPU_FAULT, GPU_HANG)

_HSA_FAULT = re.compile(r"Memory access fault by GPU node-(\d+)[^\n]*?Reason: ([^\n]*?)\.?\s*$", re.M)
_HW_EXCEPTION = re.compile(r"HW Exception by GPU node-(\d+)[^\n]*?reason\s*:\s*([^\n]*?)\s*$", re.M | re.I)
_HIP_FAULT = re.compile(r"(HIP error: [^\n]*|hipError\w+)")  # the runtime's error in the training step
_GPU_OOM = re.compile(r"(?:HIP|CUDA) (?:error: )?out of memory[^\n]*|OutOfMemoryError[^\n]*|hipErrorOutOfMemory", re.I)
_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB|TiB)"
_OOM_NUMBERS = {
    "tried": re.compile(r"Tried to allocate " + _SIZE),
    "total": re.compile(r"total capacity of " + _SIZE),
    "free": re.compile(r"of which " + _SIZE + " is free"),
    "allocated": re.compile(_SIZE + r" is allocated by PyTorch"),
    "reserved": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
}
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_DEAD_WORKER = re.compile(r"DataLoader worker \(pid[^\n]*|DataLoader timed out after[^\n]*", re.I)
_DATA = re.compile(
    r"Caught \w+ in DataLoader worker process[^\n]*|cv2\.error[^\n]*|UnidentifiedImageError[^\n]*|"
    r"Image Not Found[^\n]*",
    re.I,
)
_COLLECTIVE_ERROR = re.compile(
    r"DistBackendError[^\n]*|(?:NCCL|RCCL) (?:error|Error)[^\n]*|Watchdog caught collective operation timeout[^\n]*"
)
_KERNEL_HANG = ("ring timeout", "GPU reset", "MES")
# torch.distributed.run's ChildFailedError: the first rank that failed, and how
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+ in (\S+)')
_SECTION = re.compile(r"^===== pid (\d+) \((\w+), [^)]*\)", re.M)
_HIP_NATIVE = re.compile(r"\b(hip[A-Z]\w+|hsa_\w+|hsaKmt\w+)")  # py-spy --native: a thread in the HIP runtime
_COLLECTIVES = re.compile(r"^(all_reduce|barrier|broadcast|all_gather\w*|reduce_scatter\w*|reduce|wait|backward)$")


@dataclass(frozen=True)
class Evidence:
    """What the supervisor read about one failure (:mod:`.evidence` gathers it)."""

    failure: str  # "hang" or "crash"
    exit_code: int | None = None  # a crash: the child's exit code (negative: the signal that killed it)
    stderr: str = ""  # the tail of the child's standard error
    traceback: str = ""  # a crash: the traceback(s) the child (or its ranks) wrote
    stacks: str = ""  # a hang: the stacks of the trainer and its workers
    kernel: tuple[str, ...] = ()  # the kernel log's lines of the failure's time window
    kernel_source: str = ""  # where they came from, or why there are none
    pids: frozenset = frozenset()  # the run's processes: an OOM killer's victim among them is the run's
    multi_gpu: bool = False
    on_gpu: bool = False  # the run trains on a GPU (a trainer stuck in torch is then stuck in GPU work)
    launcher: str = ""  # several GPUs: what torch's launcher reported of this attempt (its root cause)


@dataclass(frozen=True)
class Diagnosis:
    cls: str  # one of CLASSES
    title: str  # what rocm-yolo's line calls it: "GPU memory access fault (page not present)"
    signature: str  # what makes two failures the same
    evidence: tuple[str, ...] = ()  # the lines that decided it
    detail: dict = field(default_factory=dict)  # gpu-oom: the sizes in bytes; host-oom: the victim


def normalized(text: str) -> str:
    """``text`` without what differs between two runs of the same failure: addresses, pids, long numbers."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text)
    text = re.sub(r"\bpid(\(s\))?:? ?[\d, ]+", "pid N ", text)
    return re.sub(r"\s+", " ", text).strip()[:300]


def _reason(text: str) -> str:
    short = {
        "page not present or supervisor privilege": "page not present",
        "write access to a read-only page": "write to a read-only page",
        "execute access to a page marked nx": "execute on a no-execute page",
    }
    key = text.strip().rstrip(".").lower()
    return short.get(key, key or "no reason given")


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def oom_sizes(text: str) -> dict[str, int]:
    """The sizes torch's out-of-memory message gives, in bytes: tried, total, free, allocated, reserved."""
    out = {}
    for key, rx in _OOM_NUMBERS.items():
        m = rx.search(text)
        if m:
            out[key] = _bytes(m[1], m[2])
    return out


def _kernel_kinds(lines) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in lines:
        for kind in kinds(line):
            found.setdefault(kind, []).append(line)
    return found


def _last_exception(traceback: str) -> str:
    """The traceback's final ``Type: message`` line."""
    lines = [x for x in traceback.splitlines() if x.strip() and not x.startswith((" ", "Traceback", "During", "The "))]
    return lines[-1].strip() if lines else ""


def _signal_name(code: int | None) -> str:
    return f"exit code {code}" if code is None or code >= 0 else f"killed by {signal_name(-code)}"


# --------------------------------------------------------------------------- hang stacks


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
        "torch/utils/data/" in f or f.endswith(("patches/threads.py", "patches/dataloader.py")) for f, _ in frames
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


def _where(frames) -> str:
    return f"{frames[0][1]} ({frames[0][0].rsplit('/', 2)[-1]})" if frames else "no Python stack"


def _hang(e: Evidence, kernel: dict[str, list[str]]) -> Diagnosis:
    parts = sections(e.stacks)
    trainers = [(pid, text) for pid, role, text in parts if role in ("trainer", "rank")]
    ranks = [(pid, text) for pid, role, text in parts if role == "rank"]
    mains = {pid: main_thread(text) for pid, text in (ranks or trainers)}
    for pid, frames in mains.items():
        if _waits_for_data(frames):
            stuck = [f"pid {p}: {_where(main_thread(t))}" for p, role, t in parts if role == "worker"]
            return Diagnosis(
                LOADER,
                "DataLoader hang (the trainer waits for a batch that never comes)",
                f"{LOADER}: hang in {frames[0][1]}",
                (f"trainer pid {pid} waits in {_where(frames)}", *(f"worker {s}" for s in stuck[:4])),
            )
    if e.multi_gpu and len(ranks) > 1 and all(_in_collective(f) for f in mains.values()):
        return Diagnosis(
            COLLECTIVE,
            "collective hang between the GPUs (every rank waits in a collective)",
            f"{COLLECTIVE}: hang",
            tuple(f"rank pid {pid} waits in {_where(f)}" for pid, f in mains.items()),
        )
    hung = [kind for kind in _KERNEL_HANG if kind in kernel]
    if hung:
        lines = [line for kind in hung for line in kernel[kind]]
        return Diagnosis(
            GPU_HANG, f"GPU hang (kernel log: {', '.join(hung)})", f"{GPU_HANG}: {hung[0]}", tuple(lines[:8])
        )
    outside = [pid for pid, f in mains.items() if not _in_torch(f) and not _in_collective(f)]
    if len(ranks) > 1 and 0 < len(outside) < len(mains):  # one rank stuck in Python: the others wait for it
        return _rank_stuck(mains)
    stuck = {pid: f for pid, f in mains.items() if _in_torch(f)}
    if e.on_gpu and stuck:
        pid, frames = next(iter(stuck.items()))
        return Diagnosis(
            GPU_HANG,
            f"main-process hang inside GPU work (in {frames[0][1]})",
            f"{GPU_HANG}: stuck in {frames[0][1]}",
            (f"trainer pid {pid} stuck in {_where(frames)}",),
        )
    native = [(pid, m[0]) for pid, text in trainers for m in [_HIP_NATIVE.search(_py_spy(text))] if m]
    if e.on_gpu and native:
        pid, call = native[0]
        return Diagnosis(
            GPU_HANG, f"main-process hang inside GPU work (in {call})", f"{GPU_HANG}: stuck in {call}", (f"pid {pid}",)
        )
    if len(ranks) > 1:
        return _rank_stuck(mains)
    pid, frames = next(iter(mains.items()), (None, []))
    title = f"hang (the trainer in {_where(frames)})"
    return Diagnosis(UNKNOWN, title, f"{UNKNOWN}: hang in {frames[0][1] if frames else '?'}", (title,))


def _rank_stuck(mains: dict) -> Diagnosis:
    """On several GPUs: the rank stuck outside torch and its collectives is the one the others wait for."""
    outside = ((p, f) for p, f in mains.items() if not _in_torch(f) and not _in_collective(f))
    pid, frames = next(
        outside, next(((p, f) for p, f in mains.items() if not _in_collective(f)), next(iter(mains.items())))
    )
    title = f"hang (rank pid {pid} in {_where(frames)}; the other ranks wait for it)"
    return Diagnosis(UNKNOWN, title, f"{UNKNOWN}: hang in {frames[0][1] if frames else '?'}", (title,))


# --------------------------------------------------------------------------- the rules


def _gpu_fault(e: Evidence, text: str, kernel: dict[str, list[str]]) -> Diagnosis | None:
    m = _HSA_FAULT.search(text)
    if m:
        reason = _reason(m[2])
        return Diagnosis(
            GPU_FAULT,
            f"GPU memory access fault ({reason})",
            f"{GPU_FAULT}: {reason}",
            (m[0].strip(), *kernel.get("page fault", [])[:6]),
            {"node": int(m[1]), "reason": reason},
        )
    m = _HW_EXCEPTION.search(text)
    if m:
        reason = m[2].strip()
        cls = GPU_HANG if "hang" in reason.lower() else GPU_FAULT
        return Diagnosis(
            cls, f"GPU {'hang' if cls == GPU_HANG else 'exception'} ({reason})", f"{cls}: {reason}", (m[0].strip(),)
        )
    m = _HIP_FAULT.search(text)
    if m and not _GPU_OOM.search(text):  # HIP's out of memory is gpu-oom's
        return Diagnosis(GPU_FAULT, f"GPU error ({m[1].strip()})", f"{GPU_FAULT}: {normalized(m[1])}", (m[0].strip(),))
    if e.failure == "crash" and "page fault" in kernel:
        return Diagnosis(
            GPU_FAULT, "GPU page fault (kernel log)", f"{GPU_FAULT}: page fault", tuple(kernel["page fault"][:8])
        )
    return None


def _memory(e: Evidence, text: str, kernel: dict[str, list[str]]) -> Diagnosis | None:
    m = _GPU_OOM.search(text)
    if m:
        sizes = oom_sizes(text)
        return Diagnosis(GPU_OOM, "GPU out of memory", GPU_OOM, (m[0].strip()[:300],), sizes)
    killed = [(pid, name) for pid, name in victims(e.kernel) if not e.pids or pid in e.pids]
    if killed:
        pid, name = killed[-1]
        lines = tuple(x for x in e.kernel if str(pid) in x)[:4]
        return Diagnosis(
            HOST_OOM,
            f"host out of memory: the OOM killer killed {name} (pid {pid})",
            HOST_OOM,
            lines,
            {"victim_pid": pid, "victim": name},
        )
    if _last_exception(e.traceback).startswith("MemoryError"):
        return Diagnosis(HOST_OOM, "host out of memory (MemoryError)", HOST_OOM, (_last_exception(e.traceback),))
    return None


def root_cause(launcher: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank that failed, as torch's launcher reported it last."""
    found = _ROOT_CAUSE.findall(launcher)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


_WORKER_SIGNAL = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: ([^.\n]+)|pid \d+ killed by (SIG\w+)")


def _sigkill_note(e: Evidence) -> str:
    """For a worker killed by SIGKILL: who usually sends it, and what the kernel log said of it."""
    found = _WORKER_SIGNAL.findall(f"{e.stderr}\n{e.traceback}")
    if not found:
        return ""
    torch_words, ours = found[-1]
    if torch_words.strip() != signal.strsignal(signal.SIGKILL) and ours != signal_name(signal.SIGKILL):
        return ""
    if e.kernel_source.startswith("kernel log not readable"):
        seen = f"the {e.kernel_source} to confirm it: see `dmesg` or `journalctl -k`"
    else:
        seen = "the kernel log has no OOM-killer line of the run's processes"
    return f"; SIGKILL usually comes from the kernel's out-of-memory killer ({seen})"


def _crash(e: Evidence, text: str, kernel: dict[str, list[str]]) -> Diagnosis:
    first = root_cause(e.launcher) if e.multi_gpu else None
    if first is not None and first[1] < 0:  # a rank killed by a signal: the others' errors are its consequences
        how = f"rank {first[0]} {_signal_name(first[1])}"
        return Diagnosis(UNKNOWN, f"{how}, no evidence of the cause", f"{UNKNOWN}: {how}", (how,))
    for rx, cls, title in (
        (_DEAD_WORKER, LOADER, "DataLoader worker died"),
        (_DATA, DATA_ERROR, "data error"),
        (_COLLECTIVE_ERROR, COLLECTIVE, "collective failed between the GPUs"),
    ):
        m = rx.search(text)
        if m and (cls != COLLECTIVE or e.multi_gpu):
            title = f"{title} ({m[0].strip()[:160]})" + (_sigkill_note(e) if cls == LOADER else "")
            return Diagnosis(cls, title, f"{cls}: {normalized(m[0])}", (m[0].strip(),))
    hung = [kind for kind in _KERNEL_HANG if kind in kernel]
    if hung:
        lines = [line for kind in hung for line in kernel[kind]]
        return Diagnosis(
            GPU_HANG, f"GPU hang (kernel log: {', '.join(hung)})", f"{GPU_HANG}: {hung[0]}", tuple(lines[:8])
        )
    last = _last_exception(e.traceback)
    if last:
        kind = last.split(":", 1)[0]  # the child's own line said the message already
        frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', e.traceback)
        if frames and "ultralytics/data/" in frames[-1][0]:
            return Diagnosis(DATA_ERROR, f"data error ({kind})", f"{DATA_ERROR}: {normalized(last)}", (last,))
        return Diagnosis(TRAINING_ERROR, f"training error ({kind})", f"{TRAINING_ERROR}: {normalized(last)}", (last,))
    how = _signal_name(e.exit_code)
    return Diagnosis(UNKNOWN, f"training process {how}, no evidence of the cause", f"{UNKNOWN}: {how}", (how,))


def diagnose(e: Evidence) -> Diagnosis:
    """The class of the failure ``e`` describes, with the lines that decided it."""
    text = f"{e.stderr}\n{e.traceback}"
    kernel = _kernel_kinds(e.kernel)
    found = _gpu_fault(e, text, kernel) or _memory(e, text, kernel)
    if found is not None:
        return found
    return _hang(e, kernel) if e.failure == "hang" else _crash(e, text, kernel)
