"""The kernel log, read and scanned for what the amdgpu driver and the OOM killer say: the doctor and the watchdog
share it.

:func:`read` takes the first source that answers: a file the caller names (the doctor's ``--kernel-log``, the
watchdog's :attr:`~rocm_yolo.supervisor.config.WatchdogConfig.kernel_log`, which tests set), ``/dev/kmsg`` (read
without blocking), ``dmesg``, ``journalctl -k``, each bounded in time. Every line keeps its wall-clock time where the
source gives one (``[ 123.456]`` since boot, ``/dev/kmsg``'s microseconds since boot, or a leading Unix time as
``journalctl -o short-unix`` writes it), so :func:`within` can bound the lines to a failure's time window.

:func:`scan` counts the lines that matter (:data:`PATTERNS`): the amdgpu driver's ring timeouts, GPU resets, page
faults (``VM_L2_PROTECTION_FAULT``), the MES firmware that stops responding (gfx11 APUs: ROCm/ROCm#5724, #6530),
the ``restore_userptr`` worker of forked DataLoader workers, and the OOM killer; :func:`victims` names whom the OOM
killer killed. Torch-free; reading never raises.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.process.tree import run_bounded

KMSG = "/dev/kmsg"
COMMANDS = (["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-unix", "-n", "20000"])
MAX_RECORDS = 200_000  # /dev/kmsg holds a few thousand; a bound all the same

# (name, pattern): an amdgpu line matches when the line is the driver's (AMD_LINE) and the pattern matches
PATTERNS = (
    ("userptr", re.compile(r"amdgpu_amdkfd_restore_userptr_worker")),
    ("hogged CPU", re.compile(r"hogged CPU", re.I)),
    ("GPU reset", re.compile(r"GPU reset|gpu_recover|GPU recovery|reset (begin|succeeded|failed)", re.I)),
    ("ring timeout", re.compile(r"ring \S+ timeout|\btimeout\b.*\bring\b", re.I)),
    # the KFD's scheduler could not preempt the queues (kfd_device_queue_manager.c): the GPU stopped answering
    (
        "queue preemption",
        re.compile(r"qcm fence wait loop timeout|queue preemption time ?out|Failed to evict process queues", re.I),
    ),
    ("page fault", re.compile(r"page fault|VM_L2_PROTECTION_FAULT|retry fault|memory access fault", re.I)),
    ("MES", re.compile(r"MES(?:\(\d+, ?\d+\))? failed to respon(?:d|se)", re.I)),  # older: "failed to response"
)
AMD_LINE = re.compile(r"amdgpu|amdkfd|\bkfd\b", re.I)
OOM = "OOM killer"  # not the driver's: the kernel's own line
_OOM_LINE = re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill:|invoked oom-killer", re.I)
_VICTIM = re.compile(r"Killed process (\d+) \(([^)]*)\)|oom-kill:.*?task=([^,\s]+),pid=(\d+)")

# the process an amdgpu line names: "for process X pid N" (page faults, kernels before 6.x), " in process X pid N"
# (6.x, the line after the fault), "Process information: process X pid N" (ring timeouts), "Process X pid N"
_PROCESS = re.compile(r"\b[Pp]rocess(?: information| info)?:?\s+(?:process\s+)?(\S+?)\s+pid\s+(\d+)")
_PCI = re.compile(r"\b([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])\b", re.I)  # "amdgpu 0000:03:00.0: amdgpu: ..."
_SINCE_BOOT = re.compile(r"^\s*\[\s*(\d+\.\d+)\]\s?")  # dmesg: "[  123.456789] text"
_UNIX = re.compile(r"^(\d{9,11}\.\d+)\s+\S+\s+kernel:\s?")  # journalctl -o short-unix: "1700000000.123 host kernel: "
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;")  # /dev/kmsg: "PRIORITY,SEQ,USEC,FLAGS;text"


@dataclass(frozen=True)
class KernelLine:
    time: float | None  # wall clock, where the source gives it
    text: str


@dataclass(frozen=True)
class KernelLog:
    lines: tuple[KernelLine, ...] | None  # None: no source could be read
    source: str  # where the lines came from, or why none could be read

    @property
    def readable(self) -> bool:
        return self.lines is not None


def boot_time() -> float:
    """The wall clock at boot (the kernel's ``btime``), 0.0 if unknown."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def parse(text: str, boot: float | None = None) -> tuple[KernelLine, ...]:
    """The lines of ``text`` (dmesg's, journalctl's or /dev/kmsg's format), each with its wall-clock time if given."""
    boot = boot_time() if boot is None else boot
    out = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith(" ") and "=" in raw and not _SINCE_BOOT.match(raw):
            continue  # /dev/kmsg's continuation lines (" SUBSYSTEM=...")
        when, line = None, raw
        m = _SINCE_BOOT.match(raw)
        if m:
            when = boot + float(m[1]) if boot else None  # without the boot time, no wall clock
        elif _KMSG.match(raw):
            m = _KMSG.match(raw)
            when, line = (boot + int(m[1]) / 1e6 if boot else None), raw[m.end() :]
        elif _UNIX.match(raw):
            m = _UNIX.match(raw)
            when, line = float(m[1]), raw[m.end() :]
        out.append(KernelLine(when, line.rstrip()))
    return tuple(out)


def _kmsg(limit: float) -> str | None:
    """Every record /dev/kmsg still holds, read without blocking; None when it cannot be read."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records, deadline = [], time.monotonic() + limit
    try:
        while len(records) < MAX_RECORDS and time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break  # all read
            except BrokenPipeError:
                continue  # a record was overwritten while we read: go on with the next
            except OSError:
                return None  # EPERM (dmesg_restrict) or EINVAL: another source
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").rstrip("\n"))
    finally:
        os.close(fd)
    return "\n".join(records) if records else None


def read(path: str | os.PathLike | None = None, timeout: float = 10.0) -> KernelLog:
    """The kernel log from ``path`` if given, else the first of /dev/kmsg, dmesg, journalctl that answers."""
    if path is not None:
        try:
            return KernelLog(parse(Path(path).read_text(errors="replace")), str(path))
        except OSError as e:
            return KernelLog(None, f"{path}: {e.strerror or e}")
    text = _kmsg(timeout)
    if text is not None:
        return KernelLog(parse(text), KMSG)
    reasons = [f"{KMSG}: not readable"]
    for cmd in COMMANDS:
        try:
            outcome = run_bounded(cmd, timeout)
        except OSError as e:
            reasons.append(f"{cmd[0]}: {e.strerror}")
            continue
        text = outcome.stdout
        if outcome.returncode == 0 and text.strip() and "No entries" not in text[:200]:
            return KernelLog(parse(text), " ".join(cmd[:2]))
        reasons.append(
            f"{cmd[0]}: " + ((outcome.tail(1) or ["no output"])[0] if not outcome.timed_out else "timed out")
        )
    return KernelLog(None, "; ".join(reasons))


def within(lines, start: float, end: float) -> list[KernelLine]:
    """The lines written between ``start`` and ``end`` (wall clock); a line without a time is left out."""
    return [line for line in lines if line.time is not None and start <= line.time <= end]


def kinds(text: str) -> list[str]:
    """The names of :data:`PATTERNS` (and :data:`OOM`) one line matches."""
    found = [name for name, rx in PATTERNS if rx.search(text)] if AMD_LINE.search(text) else []
    if _OOM_LINE.search(text):
        found.append(OOM)
    return found


def scan(lines) -> tuple[dict[str, int], list[str]]:
    """How often each kind of line occurs, and the lines that matter (``lines``: KernelLine or text)."""
    counts: dict[str, int] = {}
    matched = []
    for line in lines:
        text = line.text if isinstance(line, KernelLine) else line
        hit = kinds(text)
        for name in hit:
            counts[name] = counts.get(name, 0) + 1
        if hit:
            matched.append(text.strip())
    return counts, matched


def victims(lines) -> list[tuple[int, str]]:
    """(pid, name) of each process the OOM killer killed, in the order of the log."""
    out = []
    for line in lines:
        text = line.text if isinstance(line, KernelLine) else line
        m = _VICTIM.search(text)
        if m:
            pid, name = (m[1], m[2]) if m[1] else (m[4], m[3])
            if (int(pid), name) not in out:
                out.append((int(pid), name))
    return out


@dataclass(frozen=True)
class KernelEvent:
    """One thing the kernel said: a line that matters (:func:`kinds`) with the amdgpu lines that follow it."""

    kinds: tuple[str, ...]
    lines: tuple[str, ...]
    pids: tuple[int, ...] = ()  # the processes it names (a page fault's, a ring timeout's, the OOM killer's victim)
    process: str = ""  # the name of the first
    card: str | None = None  # the PCI address of the card it is about, where the line names one


def _named(text: str) -> list[tuple[int, str]]:
    """(pid, name) of the processes one line names."""
    found = [(int(m[2]), m[1]) for m in _PROCESS.finditer(text)]
    m = _VICTIM.search(text)
    if m:
        found.append((int(m[1]), m[2]) if m[1] else (int(m[4]), m[3]))
    return found


def events(lines) -> list[KernelEvent]:
    """The events of ``lines`` (KernelLine or text), in order: each line that matters starts one, and the amdgpu
    lines right after it that match nothing (the process it names, the faulting address) belong to it."""
    out: list[dict] = []
    current: dict | None = None
    for line in lines:
        text = (line.text if isinstance(line, KernelLine) else line).strip()
        found = kinds(text)
        named = _named(text)
        if found and current is not None and _continues(current, found, named, text):
            found = []  # a fault's status dump (VM_L2_PROTECTION_FAULT_STATUS) belongs to the fault above it
        if found:
            current = {"kinds": tuple(found), "lines": [text], "named": named, "card": None}
            out.append(current)
        elif current is not None and AMD_LINE.search(text):
            current["lines"].append(text)
            current["named"] += named if not current["named"] else []
        else:
            current = None
            continue
        if current["card"] is None:
            m = _PCI.search(text)
            current["card"] = m[1].lower() if m else None
    return [
        KernelEvent(
            kinds=e["kinds"],
            lines=tuple(e["lines"]),
            pids=tuple(dict.fromkeys(pid for pid, _ in e["named"])),
            process=e["named"][0][1] if e["named"] else "",
            card=e["card"],
        )
        for e in out
    ]


def _continues(current: dict, found: list[str], named, text: str) -> bool:
    """Whether a line that matters goes on the event above it: the same kind of the same card, no process of its own
    and no header of a new fault (``(src_id:``)."""
    m = _PCI.search(text)
    card = m[1].lower() if m else None
    return set(found) <= set(current["kinds"]) and card == current["card"] and not named and "(src_id" not in text


@dataclass(frozen=True)
class Attributed:
    """A window's kernel events by whose they are."""

    run: tuple[KernelEvent, ...] = ()  # they name one of the run's processes, or (naming none) one of its cards
    unnamed: tuple[KernelEvent, ...] = ()  # they name neither a process nor a card: context, never the class
    others: tuple[KernelEvent, ...] = ()  # they name another process or another card: never the run's


def attribute(found: list[KernelEvent], pids, cards) -> Attributed:
    """Sort ``found`` by whose it is: ``pids`` the run's processes, ``cards`` the PCI addresses of its cards."""
    pids, cards = set(pids), {c.lower() for c in cards}
    run, unnamed, others = [], [], []
    for event in found:
        if event.pids:
            (run if pids.intersection(event.pids) else others).append(event)
        elif event.card is not None:
            (run if event.card in cards else others).append(event)
        else:
            unnamed.append(event)
    return Attributed(tuple(run), tuple(unnamed), tuple(others))
