"""The rules that read the evidence beyond the failure's own text (:mod:`.sources` gathers it), where the text alone
cannot decide: policy, and pure, as :mod:`.diagnose` which asks them.

- :func:`oom_counted`: a process of the attempt killed by SIGKILL (the trainer, a rank, a DataLoader worker), or a
  DataLoader worker gone without a word of what killed it, while the run's own memory cgroup counted an OOM kill is
  host memory, on the kernel's own count (strong);
- :func:`from_labels`: a device-side assert or an index error, with label lines whose class id is not one of the
  data set's ``nc``, is a data error naming the file and line;
- :func:`from_override`: a GPU fault on a card whose ``HSA_OVERRIDE_GFX_VERSION`` names another architecture than
  its own (and not the one its family is known to run as) is the environment: the override is the cause, and the
  fix is the right override or none, not a retry.

The kernel's view of a hung tree's threads is read by :func:`.hangs.from_threads`.
"""

from __future__ import annotations

import re
import signal

from rocm_yolo.diagnosis import vocabulary
from rocm_yolo.diagnosis.classes import DATA_ERROR, ENVIRONMENT, GPU_FAULT, HOST_OOM, TRAINING_ERROR
from rocm_yolo.diagnosis.record import Diagnosis, Evidence
from rocm_yolo.gpu.arch import family, gfx_name, parse_override
from rocm_yolo.gpu.wheels import KNOWN_OVERRIDES

CGROUP_WHY = (
    "the run's memory cgroup counted an OOM kill during the attempt (Linux mm/oom_kill.c counts every OOM kill in the "
    "victim's cgroup and those above it: cgroup v2 memory.events oom_kill, v1 memory.oom_control oom_kill)"
)
CGROUP_NONE = "a SIGKILL, and the run's memory cgroup counted no OOM kill: not the kernel's OOM killer"
LABELS_WHY = (
    "a kernel's index check (or torch's IndexError on the CPU) failed, and label lines hold class ids outside the "
    "data set's nc: the loss indexes its classes with them (checked as the doctor does, "
    "rocm_yolo/ultralytics_rules/data/labels.py check_label)"
)
OVERRIDE_WHY = (
    "HSA_OVERRIDE_GFX_VERSION makes the runtime load another architecture's code objects on the card "
    "(libhsakmt topology.c); one that is not the card's own misroutes its kernels: ROCm/rocm-systems#3461 and #5686 "
    "make libhsakmt refuse such overrides for the crashes, GPU resets and hangs they cause"
)
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid[^\n]*(?:killed by signal: Killed|killed by SIGKILL)")
# torch's words for a worker found dead without its signal (torch/utils/data/dataloader.py _try_get_data)
_WORKER_GONE = re.compile(r"DataLoader worker \(pid\(s\)[^\n]*exited unexpectedly")
_INDEX = re.compile(r"^(?:[\w.]+\.)?IndexError\b")
_GIB = 1 << 30


def size(n: int) -> str:
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n / (1 << 20):.0f} MiB"


def sigkilled(e: Evidence, text: str, rank: tuple[int, int] | None) -> str:
    """Which process of the attempt died of SIGKILL, as its exit or torch said it, or a DataLoader worker torch found
    gone without saying by what (the OOM killer's SIGKILL is one such end: the cgroup's count says whether it was);
    "" for none."""
    if rank is not None and rank[1] == -signal.SIGKILL:
        return f"rank {rank[0]} killed by SIGKILL"
    if e.exit_code == -signal.SIGKILL:
        return "training process killed by SIGKILL"
    m = _WORKER_KILLED.search(text)
    if m:
        return f"a DataLoader worker killed by SIGKILL ({m[0][:120]})"
    m = _WORKER_GONE.search(text)
    return f"a DataLoader worker gone ({m[0][:120]})" if m else ""


def oom_counted(e: Evidence, how: str) -> Diagnosis | None:
    """Host memory, when a process of the attempt died of SIGKILL (``how``) and the run's cgroup counted an OOM kill
    during the attempt; None otherwise."""
    if not how or not e.cgroup_kills:
        return None
    allows = (
        f"it allows {size(e.cgroup_limit)}" if e.cgroup_limit else "it sets no limit of its own: the machine ran out"
    )
    title = f"host out of memory: the run's cgroup counted {e.cgroup_kills} OOM kill(s) during the attempt ({allows})"
    detail = {"oom_kills": e.cgroup_kills, "limit": e.cgroup_limit, "victim": how}
    return Diagnosis(HOST_OOM, title, HOST_OOM, (how, e.cgroup_source), detail, False, CGROUP_WHY)


def asks_labels(e: Evidence) -> bool:
    """A crash whose error is a kernel's index check (a device-side assert) or an index error: the labels' class ids
    are worth checking (:func:`.sources.labels`)."""
    if e.failure != "crash":
        return False
    found = vocabulary.first(vocabulary.clean(f"{e.stderr}\n{e.traceback}"))
    return (found is not None and found[0].name == "device-side assert") or bool(
        _INDEX.match(vocabulary.last_exception(e.traceback))
    )


def from_labels(e: Evidence, found: Diagnosis) -> Diagnosis:
    """``found`` (a training error from an index check) as a data error, when the labels hold class ids out of range."""
    if found.cls != TRAINING_ERROR or found.weak or not e.labels or not asks_labels(e):
        return found
    first = e.labels[0]
    named = first.split(":", 1)[0]
    title = f"data error: label class ids out of range ({first}; {len(e.labels)} such line(s) found)"
    evidence = (*found.evidence, *e.labels, e.labels_source)
    detail = {"file": named, "labels": list(e.labels)}
    signature = f"{DATA_ERROR}: label class id out of range"
    return Diagnosis(DATA_ERROR, title, signature, evidence, detail, False, LABELS_WHY)


def wrong_overrides(overrides) -> list[tuple[str, str, str]]:
    """(the card's architecture, the override, what it runs the card as) for each override that names another
    architecture than the card's own and is not the one its family is known to run as (gpu/wheels.KNOWN_OVERRIDES)."""
    wrong = []
    for arch, value in overrides:
        version = parse_override(value)
        runs_as = gfx_name(version) if version else f"nothing ({value!r} is no version)"
        known = KNOWN_OVERRIDES.get(family(arch))
        if runs_as != arch and not (known is not None and known.good == value.strip()):
            wrong.append((arch, value.strip(), runs_as))
    return wrong


def from_override(e: Evidence, found: Diagnosis) -> Diagnosis:
    """``found`` (a GPU fault) as the environment's, when an override runs the card as another architecture."""
    wrong = wrong_overrides(e.overrides) if found.cls == GPU_FAULT and not found.weak else []
    if not wrong:
        return found
    arch, value, runs_as = wrong[0]
    title = (
        f"{found.title} with HSA_OVERRIDE_GFX_VERSION={value} on a {arch} card: the override runs it as {runs_as}, "
        "whose code is not the card's (the fix: the card's own override, or none)"
    )
    evidence = (*found.evidence, f"HSA_OVERRIDE_GFX_VERSION={value}", f"the card: {arch} (the KFD topology)")
    detail = {**found.detail, "override": value, "card": arch}
    why = f"{OVERRIDE_WHY}; the fault: {found.why}"
    return Diagnosis(ENVIRONMENT, title, f"{ENVIRONMENT}: override {value} on {arch}", evidence, detail, False, why)
