"""The failure classes: one :class:`FailureClass` record each, in :data:`CLASSES`, and everything that follows from it.

A class decides what the watchdog does about a failure, so each record holds what the rest of the diagnosis asks of
its class: the title a diagnosis gets when the runtime's words give no more, the remedy (with evidence of the
failure's own, and read from context alone), the exit code its stops give, whether the GPU itself failed (the next
attempt waits for the GPU to be released, and a second such failure stops), whether its words are the GPU runtime's
(an exception with them before training is the environment's: :mod:`rocm_yolo.triage`), and which calls of it harm
(``tests/corpus/score.py``). The words that mean a class point at its record (:class:`.vocabulary.Word`); the
remedies (:mod:`.remedies`), the titles (:mod:`.diagnose`), the metrics' series
(:mod:`rocm_yolo.supervisor.reporting`) and the table in docs/watchdog.md (:func:`docs_table`) are read from the
records. A new class is one record here, its words in :mod:`.vocabulary` and its cases in ``tests/corpus/``.

Torch-free and pure.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rocm_yolo import errors

# the remedies (diagnosis.remedies carries them out)
LADDER, SAME, P2P_OFF, STOP = "ladder", "same", "p2p-off", "stop"
REMEDIES = (LADDER, SAME, P2P_OFF, STOP)

# the names the rules mention (events, metrics and supervisor.json call the classes so)
LOADER, GPU_HANG, GPU_FAULT, GPU_OOM, HOST_OOM = "loader", "gpu-hang", "gpu-fault", "gpu-oom", "host-oom"
COLLECTIVE, ENVIRONMENT, TRAINING_ERROR, DATA_ERROR = "collective", "environment", "training-error", "data-error"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class FailureClass:
    """One class of failure: what it is called, and what the watchdog does about it."""

    name: str  # as events, metrics.prom and supervisor.json say it: "gpu-fault"
    title: str  # a diagnosis of it, when the runtime's words give no more: "GPU error"
    what: str  # what failed, in a few words (docs/watchdog.md)
    remedy: str  # with evidence of the failure's own: LADDER, SAME, P2P_OFF or STOP
    weak_remedy: str  # read from context alone: never STOP (a remedy that retries)
    stop_exit: int  # the run's exit code when it stops for this class (errors.SETUP: the environment's)
    does: str  # what the watchdog does about it, in a few words (docs/watchdog.md)
    stops: str  # when it stops the run, and with what (docs/watchdog.md)
    gpu_side: bool = False  # the GPU itself failed: the next attempt waits for it to be released; a second stops
    gpu_runtime: bool = False  # its words are the GPU runtime's: before training, the environment's (triage)
    stop_harms: bool = False  # a retry may cure it: stopping the run at once harms
    ladder_harms: bool = False  # a lighter loader cannot cure it: the loader ladder wastes the restarts


def _gpu(name: str, title: str, what: str) -> FailureClass:
    """A failure of the GPU itself: the same profile once the GPU is released, once; the second one stops."""
    return FailureClass(
        name, title, what, SAME, SAME, errors.SETUP, _GPU_DOES, _GPU_STOPS, gpu_side=True, gpu_runtime=True,
        ladder_harms=True,
    )  # fmt: skip


_GPU_DOES = "the same profile (the loader is not the cause), once the GPU is released, once"
_GPU_STOPS = (
    "on the second GPU failure, with a verdict: the fault, where, the known fixes for the card with their sources"
)

CLASSES: tuple[FailureClass, ...] = (
    FailureClass(
        LOADER,
        "DataLoader worker died",
        "a DataLoader worker died or timed out, its shared memory ran out, or the trainer waits for a batch",
        LADDER,
        LADDER,
        errors.SAME_FAILURE,
        "the next profile of the ladder (`fast` → `safe` → `threads` → `single`), as long as restarts are left",
        "for the same twice at the same place",
        stop_harms=True,
    ),
    _gpu(
        GPU_HANG,
        "GPU hang",
        "the GPU runtime's hang, amdgpu's ring timeout or reset of the attempt's card, the trainer stuck in GPU work",
    ),
    _gpu(
        GPU_FAULT,
        "GPU error",
        "the GPU runtime's fault (its abort texts, HIP's errors, amdgpu's page fault of the attempt's process or card)",
    ),
    FailureClass(
        GPU_OOM,
        "GPU out of memory",
        "GPU memory refused",
        STOP,
        SAME,
        errors.SETUP,
        "none: the same batch would fail again (Ultralytics halves the batch itself only on one GPU, in the first "
        "epoch)",
        "at once: the batch that failed (after Ultralytics' own halving), and a smaller one that the free VRAM "
        "suggests, never one that already failed",
        gpu_runtime=True,
    ),
    FailureClass(
        HOST_OOM,
        "host out of memory",
        "host memory refused, or the OOM killer's victim is the attempt's",
        LADDER,
        LADDER,
        errors.SETUP,
        "the next profile of the ladder (`safe`: fewer workers)",
        "for the same twice at the same place",
        stop_harms=True,
    ),
    FailureClass(
        COLLECTIVE,
        "collective failed between the GPUs",
        "the GPUs' collectives timed out or failed (or, in a hang, every rank waits in one)",
        P2P_OFF,
        P2P_OFF,
        errors.SETUP,
        "the same profile with `NCCL_P2P_DISABLE=1` (`NCCL_SHM_DISABLE=1` when /dev/shm had no room for NCCL's "
        "segment), and says so, once the GPUs are released, once",
        "on the second, with a verdict: `HSA_FORCE_FINE_GRAIN_PCIE=1`, slot topology, `iommu=pt` (for /dev/shm: "
        "`--ipc=host` or `--shm-size`)",
    ),
    FailureClass(
        ENVIRONMENT,
        "the installed software cannot run on this GPU",
        "no code object or kernels for the card, no GPU visible, a library without kernels for its architecture",
        STOP,
        SAME,
        errors.SETUP,
        "none: the software cannot run on this card, and a restart would meet it again",
        "at once, with what makes it run: a torch built for the card (AMD's wheel for its architecture), the "
        "`HSA_OVERRIDE_GFX_VERSION` value its family is known to run with, for MIOpen `--conv gemm` and "
        "`amp=False`, `rocm-yolo doctor`",
        gpu_runtime=True,
        ladder_harms=True,
    ),
    FailureClass(
        TRAINING_ERROR,
        "training error",
        "any other error of the training step (a device-side assert included: the step's own data)",
        SAME,
        LADDER,
        errors.SAME_FAILURE,
        "the same profile",
        "for the same twice at the same place",
        stop_harms=True,
    ),
    FailureClass(
        DATA_ERROR,
        "data error",
        "a sample failed to load (named by its file where the error names one)",
        SAME,
        LADDER,
        errors.SAME_FAILURE,
        "the same profile",
        "for the same twice at the same place",
        stop_harms=True,
    ),
    FailureClass(
        UNKNOWN,
        "failure of unknown cause",
        "no evidence: a signal with no word, a process of the run stopped from outside, a hang elsewhere",
        LADDER,
        LADDER,
        errors.SAME_FAILURE,
        "the ladder, as for the loader",
        "for the same twice at the same place, which needs a word of the failure's own (a signal with no word is "
        'never "the same")',
    ),
)

NAMES: tuple[str, ...] = tuple(c.name for c in CLASSES)  # in this order: the metrics' series
_BY_NAME = {c.name: c for c in CLASSES}
GPU_CLASSES: tuple[str, ...] = tuple(c.name for c in CLASSES if c.gpu_side)
ENVIRONMENT_CLASSES: tuple[str, ...] = tuple(c.name for c in CLASSES if c.stop_exit == errors.SETUP)


def named(name: str) -> FailureClass:
    """The record of the class ``name``; a KeyError for a name no record has (a word of a class not declared)."""
    return _BY_NAME[name]


def of(name: str) -> FailureClass:
    """The record of the class ``name`` (a name no record has, from an older supervisor.json say: ``unknown``'s)."""
    return _BY_NAME.get(name, _BY_NAME[UNKNOWN])


def incomplete(record: FailureClass) -> list[str]:
    """What ``record`` lacks or holds wrong (``[]`` for a complete one): a test holds every record to it."""
    wrong = [f.name for f in fields(record) if isinstance(getattr(record, f.name), str) and not getattr(record, f.name)]
    if record.remedy not in REMEDIES:
        wrong.append(f"remedy {record.remedy!r}")
    if record.weak_remedy not in REMEDIES or record.weak_remedy == STOP:
        wrong.append(f"weak_remedy {record.weak_remedy!r} (a weak diagnosis retries)")
    if record.stop_exit not in (errors.SETUP, errors.SAME_FAILURE):
        wrong.append(f"stop_exit {record.stop_exit}")
    if record.stop_harms and record.remedy == STOP:
        wrong.append("stop_harms, and its remedy stops")
    if record.ladder_harms and LADDER in (record.remedy, record.weak_remedy):
        wrong.append("ladder_harms, and its remedy is the ladder")
    return wrong


def docs_table() -> str:
    """What the watchdog does, by class: the table docs/watchdog.md holds (a test holds the docs to it)."""
    rows = ["| class | remedy | exit code |", "|---|---|---|"]
    for c in CLASSES:
        rows.append(f"| `{c.name}` | {c.does} | {_exit(c)} |")
    return "\n".join(rows)


def _exit(c: FailureClass) -> str:
    out = f"{errors.FAILED} when the restarts run out; " if c.remedy == LADDER else ""
    return out + f"{c.stop_exit} {c.stops}"
