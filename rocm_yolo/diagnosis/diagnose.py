"""What failed, read from the evidence: one class per failure, the lines that decided it and why, and a signature.

Policy, and pure: :func:`diagnose` reads nothing but its :class:`Evidence` (what :mod:`.evidence` gathered) and
returns a :class:`Diagnosis` of one of the classes of :data:`.classes.CLASSES` (each record says what failed, and
what the watchdog does about it).

**Evidence is the failure's own.** Only what the failing attempt wrote since its last progress (its stderr, the
traceback of its crash, the stacks of its hang, the exit status) and what the kernel said of its processes or
cards may decide the class: the runtimes' words of :mod:`.vocabulary`. rocm-yolo's own lines are never read
(:func:`rocm_yolo.run.events.foreign`), and another process's kernel lines never. What came before the last
progress, and kernel lines that name no process and no card, are context: a class read from context alone is
``weak``, and a weak diagnosis never stops a run (:mod:`.remedies`). A death by a signal with no word has no
signature: it cannot be "the same failure" twice.

The signature is what makes two failures "the same": the class and the deciding line, without numbers,
addresses, paths and timestamps (:func:`normalized`).
"""

from __future__ import annotations

import re
import signal

from rocm_yolo.diagnosis import beyond, hangs, vocabulary
from rocm_yolo.diagnosis.classes import (
    COLLECTIVE,
    DATA_ERROR,
    ENVIRONMENT,
    GPU_FAULT,
    GPU_HANG,
    GPU_OOM,
    HOST_OOM,
    LOADER,
    TRAINING_ERROR,
    UNKNOWN,
)
from rocm_yolo.diagnosis.record import Diagnosis, Evidence
from rocm_yolo.diagnosis.vocabulary import Word, last_exception
from rocm_yolo.gpu.kernel_log import OOM, kinds, victims
from rocm_yolo.process.lifecycle import signal_name

_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB|TiB)"
_OOM_NUMBERS = {
    "tried": re.compile(r"Tried to allocate " + _SIZE),
    "total": re.compile(r"total capacity of " + _SIZE),
    "free": re.compile(r"of which " + _SIZE + " is free"),
    "allocated": re.compile(_SIZE + r" is allocated by PyTorch"),
    "reserved": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
}
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_KERNEL_FAULT = ("page fault",)
_KERNEL_HANG = ("ring timeout", "GPU reset", "MES", "queue preemption")
_HSA_REASON = re.compile(r"Memory access fault by GPU node-(\d+)[^\n]*?Reason: ([^\n]*?)\.?\s*$", re.M)
_HSA_STATUS = re.compile(r"(HSA_STATUS_ERROR_\w+)")
_HIP_NAME = re.compile(r"HIP error: ([^\n]*?)\s*$|\b(hipError\w+)", re.M)
# torch.distributed.run: the first rank that failed ("Root Cause" of ChildFailedError), or its log line of a rank
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_FILE = re.compile(r"((?:[A-Za-z]:)?[/\\][^\s'\"]+?\.(?:jpe?g|png|bmp|tiff?|webp|dng|mpo|pfm|heic|txt|npy))\b", re.I)
_TRACE_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


_NOISE = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), " "),  # ISO timestamps
    (re.compile(r"\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+"), " "),  # glog's (torch's C++ and launcher lines)
    (re.compile(r"\b\d\d?:\d\d:\d\d(?:[.,]\d+)?\b"), " "),  # clock times
    (re.compile(r"\[\s*\d+\.\d+\]"), " "),  # the kernel's seconds since boot
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[/\\][^\s/\\:'\"()\[\],]+)+[/\\]?"), "PATH"),
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", re.I), "ID"),  # uuids
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
)


def normalized(text: str) -> str:
    """``text`` without what differs between two runs of the same failure: timestamps, addresses, paths (temporary
    ones included), pids, worker indices, step counters and every other number."""
    for rx, to in _NOISE:
        text = rx.sub(to, text)
    return re.sub(r"\s+", " ", text).strip()[:300]


def oom_sizes(text: str) -> dict[str, int]:
    """The sizes torch's out-of-memory message gives, in bytes: tried, total, free, allocated, reserved."""
    out = {}
    for key, rx in _OOM_NUMBERS.items():
        m = rx.search(text)
        if m:
            out[key] = int(float(m[1]) * _UNITS[m[2]])
    return out


def _reason(text: str) -> str:
    short = {
        "page not present or supervisor privilege": "page not present",
        "write access to a read-only page": "write to a read-only page",
        "execute access to a page marked nx": "execute on a no-execute page",
    }
    key = text.strip().rstrip(".").lower()
    return short.get(key, key or "no reason given")


def _how(code: int | None) -> str:
    return f"exit code {code}" if code is None or code >= 0 else f"killed by {signal_name(-code)}"


def _named_file(line: str, text: str) -> str:
    """The file a data error names: in its own line, else in the message lines of the text."""
    m = _FILE.search(line)
    if m:
        return m[1]
    for x in text.splitlines():
        if not x.startswith((" ", "\t")) and 'File "' not in x:
            m = _FILE.search(x)
            if m:
                return m[1]
    return ""


# --------------------------------------------------------------------------- words into a diagnosis


def _from_word(word: Word, line: str, text: str, weak: bool) -> Diagnosis:
    cls, detail, title = word.cls, {}, ""
    plain = word.failure.title  # what its class is called when the line gives no more
    why = f"{word.name}" + (f" ({word.meaning})" if word.meaning else "") + f": {word.source}"
    key = line
    if cls == GPU_FAULT and (m := _HSA_REASON.search(line)):
        reason = _reason(m[2])
        title, detail, key = f"GPU memory access fault ({reason})", {"node": int(m[1]), "reason": reason}, reason
    elif cls in (GPU_FAULT, GPU_HANG, ENVIRONMENT) and (m := _HSA_STATUS.search(line)):
        title, key = f"{plain} ({m[1]})", m[1]
    elif cls in (GPU_FAULT, GPU_HANG, ENVIRONMENT) and (m := _HIP_NAME.search(line)):
        title = f"{plain} ({(m[1] or m[2]).strip()[:120]})"
    elif cls == GPU_HANG and "reason" in line.lower():
        title, key = f"GPU hang ({line.rsplit(':', 1)[-1].strip()})", "GPU Hang"
    elif cls == GPU_OOM:
        detail = oom_sizes(text)
        title, key = "GPU out of memory", ""
    elif cls == DATA_ERROR:
        named = _named_file(line, text)
        title = f"data error ({word.name}: {named})" if named else f"data error ({line[:160]})"
        detail = {"file": named} if named else {}
    elif cls == TRAINING_ERROR:
        title = f"training error ({word.name}: {word.meaning.split(':')[0]})"
    if not title:
        title = f"{plain} ({line[:160]})"
    detail["word"] = word.name
    return Diagnosis(cls, title, f"{cls}: {normalized(key)}" if key else cls, (line,), detail, weak, why)


def _kernel(lines: tuple[str, ...], e: Evidence, weak: bool) -> Diagnosis | None:
    """A class from the kernel's lines: a GPU hang (ring timeout, GPU reset, MES), a page fault when the attempt
    died, the OOM killer's victim."""
    found: dict[str, list[str]] = {}
    for line in lines:
        for kind in kinds(line):
            found.setdefault(kind, []).append(line)
    why = "the amdgpu driver's kernel lines (Linux drivers/gpu/drm/amd: amdgpu_job_timedout, gmc_v*_0.c)"
    hung = [kind for kind in _KERNEL_HANG if kind in found]
    if hung:
        shown = [line for kind in hung for line in found[kind]][:8]
        sig = f"{GPU_HANG}: {hung[0]}"
        return Diagnosis(GPU_HANG, f"GPU hang (kernel log: {', '.join(hung)})", sig, tuple(shown), {}, weak, why)
    if "page fault" in found and e.failure == "crash":
        fault = tuple(found["page fault"][:8])
        return Diagnosis(GPU_FAULT, "GPU page fault (kernel log)", f"{GPU_FAULT}: page fault", fault, {}, weak, why)
    killed = victims(lines)  # the lines are the attempt's already: so are their victims
    if killed and OOM in found:
        pid, name = killed[-1]
        shown = tuple(x for x in lines if str(pid) in x)[:4]
        title = f"host out of memory: the OOM killer killed {name} (pid {pid})"
        detail = {"victim_pid": pid, "victim": name}
        return Diagnosis(HOST_OOM, title, HOST_OOM, shown, detail, weak, "the kernel's OOM killer (mm/oom_kill.c)")
    return None


# signals a process gets from outside (a user, the OOM killer, a scheduler), not from its own runtime's abort
_FROM_OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _rank_killed(e: Evidence) -> tuple[int, int] | None:
    """On several GPUs, (rank, exit code) of the first rank killed by a signal from outside, as torch's launcher
    said (a rank that aborted itself said why: its words decide)."""
    if not e.multi_gpu:
        return None
    found = [(int(r), int(c)) for r, c in _ROOT_CAUSE.findall(e.launcher)]
    found += [(int(r), int(c)) for c, r in _RANK_FAILED.findall(f"{e.launcher}\n{e.stderr}")]
    return next(((r, c) for r, c in found if c < 0 and -c in _FROM_OUTSIDE), None)


def root_cause(launcher: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank that failed, as torch's launcher reported it last."""
    found = _ROOT_CAUSE.findall(launcher)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def _signal_death(e: Evidence, killed: tuple[int, int] | None) -> Diagnosis:
    """A death by a signal (the attempt's, or its first rank's) with no word of the process about it."""
    code = killed[1] if killed else e.exit_code
    how = (f"rank {killed[0]} " if killed else "training process ") + _how(code)
    if code == -signal.SIGKILL and e.cgroup_kills == 0:  # counted, and none: not the kernel's OOM killer
        title = f"{how}, no evidence of the cause (the run's cgroup counted no OOM kill during the attempt)"
        return Diagnosis(UNKNOWN, title, "", (how, e.cgroup_source), {}, False, beyond.CGROUP_NONE)
    if code == -signal.SIGKILL and not e.kernel_readable:
        cgroup = f"; the {e.cgroup_source}" if e.cgroup_source else ""
        title = (
            f"{how}; probably host out of memory (the kernel's OOM killer sends SIGKILL; the {e.kernel_source}{cgroup})"
        )
        return Diagnosis(HOST_OOM, title, "", (how,), {}, True, "SIGKILL with no word: the OOM killer's signal")
    if code == -signal.SIGKILL:
        title = f"{how}, no evidence of the cause (the kernel log has no OOM-killer line of the run's processes)"
    else:
        title = f"{how}, no evidence of the cause"
    return Diagnosis(UNKNOWN, title, "", (how,), {}, False, "a signal and no word from the process: nothing to name")


FATAL = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


def _native_fault(e: Evidence, text: str) -> Diagnosis | None:
    """A death by a fatal signal (as the supervisor sees it, -SIG; as a shell says it, 128 + SIG) whose output places
    the fault in a native frame of the GPU runtime's libraries (:data:`.vocabulary.FAULT_FRAMES`): the GPU's side; or,
    in faulthandler's dump, in torch's first call into the GPU runtime (:data:`.vocabulary.START_FRAMES`): the
    installed runtime cannot start here."""
    code = e.exit_code
    number = -code if code is not None and code < 0 else code - 128 if code is not None and code > 128 else None
    if number not in FATAL:
        return None
    found = vocabulary.first(text, vocabulary.FAULT_FRAMES)
    if found is None:
        frame = vocabulary.faulting_frame(text)
        found = vocabulary.first(frame, vocabulary.START_FRAMES) if frame else None
    if found is None:
        return None
    word, line = found
    where = "as the GPU runtime started" if word in vocabulary.START_FRAMES else "in the GPU runtime"
    title = f"training process killed by {signal.Signals(number).name} {where} ({line.strip()[:120]})"
    why = f"{word.name} ({word.meaning}): {word.source}"
    return Diagnosis(word.cls, title, f"{word.cls}: {signal.Signals(number).name} in the GPU runtime", (line,), why=why)


def _sigkill_note(e: Evidence, line: str) -> str:
    """For a worker killed by SIGKILL: who usually sends it, and what the kernel log said of it."""
    if not re.search(r"killed by signal: Killed|killed by SIGKILL", line):
        return ""
    if not e.kernel_readable:
        seen = f"the {e.kernel_source} to confirm it: see `dmesg` or `journalctl -k`"
    else:
        seen = "the kernel log has no OOM-killer line of the run's processes"
    if e.cgroup_kills == 0:  # counted, and none
        seen += "; the run's cgroup counted no OOM kill during the attempt: not the kernel's"
    return f"; SIGKILL usually comes from the kernel's out-of-memory killer ({seen})"


def _traceback_error(e: Evidence, weak: bool) -> Diagnosis | None:
    last = last_exception(e.traceback)
    frames = _TRACE_FRAME.findall(e.traceback)
    why = "the crash's own traceback"
    if frames and "torch/utils/data/" in frames[-1][0]:  # raised by the DataLoader's own machinery
        where = f"{frames[-1][1]} ({frames[-1][0].rsplit('/', 1)[-1]})"
        title = f"DataLoader failed ({last or 'in ' + where})"
        return Diagnosis(LOADER, title, f"{LOADER}: {normalized(last or where)}", (last or where,), {}, weak, why)
    if not last:
        return None
    kind = last.split(":", 1)[0]
    if frames and "ultralytics/data/" in frames[-1][0]:
        named = _named_file(last, e.traceback)
        title = f"data error ({kind}{': ' + named if named else ''})"
        detail = {"file": named} if named else {}
        return Diagnosis(DATA_ERROR, title, f"{DATA_ERROR}: {normalized(last)}", (last,), detail, weak, why)
    return Diagnosis(
        TRAINING_ERROR, f"training error ({kind})", f"{TRAINING_ERROR}: {normalized(last)}", (last,), {}, weak, why
    )


# --------------------------------------------------------------------------- the rules


def _crash(e: Evidence) -> Diagnosis:
    text = vocabulary.clean(f"{e.stderr}\n{e.traceback}")
    found = vocabulary.first(text)
    killed = _rank_killed(e)
    # the kernel's word of the run (its log's lines, its cgroup's count of OOM kills) explains a death by SIGKILL
    from_kernel = _kernel(e.kernel, e, weak=False) or beyond.oom_counted(e, beyond.sigkilled(e, text, killed))
    # a worker's death or a collective's failure is what the kernel's word of the run explains (its OOM killer, a
    # GPU hang); on several GPUs, what the other ranks say after one was killed by a signal is its consequence
    consequence = found is not None and found[0].cls in (COLLECTIVE, LOADER)
    if (
        found is not None
        and not (consequence and from_kernel is not None)
        and not (killed and found[0].cls in (COLLECTIVE, LOADER, DATA_ERROR, TRAINING_ERROR))
    ):
        word, line = found
        diagnosis = _from_word(word, line, text, weak=False)
        if word.cls == LOADER:
            diagnosis = _with_title(diagnosis, diagnosis.title + _sigkill_note(e, line))
        return diagnosis
    if from_kernel is not None:
        return from_kernel
    if killed is not None:  # a rank killed by a signal: the others' errors are its consequences
        return _signal_death(e, killed)
    from_traceback = _traceback_error(e, weak=False)
    if from_traceback is not None:
        return from_traceback
    native = _native_fault(e, f"{text}\n" + "\n".join(e.kernel))
    if native is not None:
        return native
    if e.exit_code is not None and e.exit_code < 0:
        return _signal_death(e, None)
    return Diagnosis(
        UNKNOWN, f"training process {_how(e.exit_code)}, no evidence of the cause", "", (_how(e.exit_code),)
    )


def _hang(e: Evidence) -> Diagnosis:
    """A hang: the kernel's word of a GPU hang first, then the stacks, then what the stderr says."""
    from_kernel = _kernel(e.kernel, e, weak=False)
    if from_kernel is not None and from_kernel.cls == GPU_HANG:
        return from_kernel
    text = vocabulary.clean(e.stderr)
    found = vocabulary.first(text)
    if found is not None and found[0].cls == GPU_HANG:
        return _from_word(*found, text, weak=False)
    from_stacks = (
        hangs.from_stacks(e.stacks, multi_gpu=e.multi_gpu, on_gpu=e.on_gpu)
        or hangs.from_traceback(text)
        or hangs.from_native(text)
    )
    if from_stacks is not None and from_stacks.cls in (LOADER, COLLECTIVE):
        return from_stacks
    from_threads = hangs.from_threads(e.threads, e.workers)  # where the kernel says the trainer's main thread waits
    if from_threads is not None:
        return from_threads
    if found is not None:
        return _from_word(*found, text, weak=False)
    if from_stacks is not None:
        return from_stacks
    return hangs.nowhere(e.stacks, e.threads)


def _context(e: Evidence, found: Diagnosis) -> Diagnosis:
    """No evidence of the failure's own: what the context suggests, weakly (a remedy that retries)."""
    text = vocabulary.clean(e.earlier)
    word = vocabulary.first(text)
    if word is not None:
        inferred = _from_word(*word, text, weak=True)
    else:
        inferred = _kernel(e.kernel_context, e, weak=True)
    if inferred is None and e.failure == "hang" and e.multi_gpu and not e.stacks.strip():
        return Diagnosis(
            COLLECTIVE,
            "hang on several GPUs with no stack and no word: most often a collective (RCCL)",
            "",
            (),
            {},
            True,
            "no stacks could be read; a silent hang between GPUs is RCCL's usual one",
        )
    if inferred is None:
        return found
    title = f"{inferred.title}; inferred from context only ({found.title})"
    return Diagnosis(inferred.cls, title, "", inferred.evidence, inferred.detail, True, inferred.why)


def _with_title(d: Diagnosis, title: str) -> Diagnosis:
    return Diagnosis(d.cls, title, d.signature, d.evidence, d.detail, d.weak, d.why)


def diagnose(e: Evidence) -> Diagnosis:
    """The class of the failure ``e`` describes, with the lines that decided it and why."""
    found = _hang(e) if e.failure == "hang" else _crash(e)
    found = beyond.from_override(e, beyond.from_labels(e, found))  # what the text cannot decide, the machine may
    return _context(e, found) if found.cls == UNKNOWN and not found.signature else found
