"""The diagnosis' records: the :class:`Evidence` of one failure, and the :class:`Diagnosis` read from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from rocm_yolo.process.kernel_view import ThreadView


@dataclass(frozen=True)
class Evidence:
    """What the supervisor read about one failure (:mod:`.evidence` gathers it)."""

    failure: str  # "hang" or "crash"
    exit_code: int | None = None  # a crash: the child's exit code (negative: the signal that killed it)
    stderr: str = ""  # what the child wrote to stderr since its last progress, rocm-yolo's own lines left out
    traceback: str = ""  # a crash: the traceback(s) the child (or its ranks) wrote
    stacks: str = ""  # a hang: the stacks of the trainer and its workers
    kernel: tuple[str, ...] = ()  # the kernel's lines about the attempt's processes or cards, in its window
    kernel_source: str = ""  # where they came from, or why there are none
    pids: frozenset = frozenset()  # the attempt's processes (the kernel's lines are sorted by them already)
    multi_gpu: bool = False
    on_gpu: bool = False  # the run trains on a GPU (a trainer stuck in torch is then stuck in GPU work)
    launcher: str = ""  # several GPUs: what torch's launcher reported of this attempt (its root cause)
    earlier: str = ""  # context: what the child wrote before its last progress
    kernel_context: tuple[str, ...] = ()  # context: the window's kernel lines that name no process and no card
    kernel_others: tuple[str, ...] = ()  # other processes' and cards' lines: in the report, never the class
    batch: int | None = None  # a crash: the batch size the trainer had when it failed
    # beyond the failure's text (diagnosis.sources): each with where it came from, or why there is nothing
    cgroup_kills: int | None = None  # OOM kills the run's memory cgroup counted during the attempt; None: unreadable
    cgroup_limit: int | None = None  # bytes the cgroup allows; None: no limit, or unreadable
    cgroup_source: str = ""
    labels: tuple[str, ...] = ()  # label lines whose class id is not one of nc's: "FILE:LINE: class id 7 out of ..."
    labels_source: str = ""  # what was checked against which nc ("" when the failure asked for no check)
    threads: tuple[ThreadView, ...] = ()  # a hang: the kernel's view of each thread of the tree (state, wchan, call)
    workers: tuple[int, ...] = ()  # the attempt's DataLoader workers, as they recorded themselves (pids)
    overrides: tuple[tuple[str, str], ...] = ()  # (a card's own architecture, the HSA_OVERRIDE_GFX_VERSION it had)

    @property
    def kernel_readable(self) -> bool:
        return not self.kernel_source.startswith("kernel log not readable")


@dataclass(frozen=True)
class Diagnosis:
    cls: str  # the name of one of classes.CLASSES
    title: str  # what rocm-yolo's line calls it: "GPU memory access fault (page not present)"
    signature: str  # what makes two failures the same ("" for a death without a word: never the same)
    evidence: tuple[str, ...] = ()  # the lines that decided it
    detail: dict = field(default_factory=dict)  # gpu-oom: the sizes in bytes; host-oom: the victim; ...
    weak: bool = False  # read from context alone: a remedy that retries, never a stop
    why: str = ""  # why those lines mean that class (the runtime and its source)
