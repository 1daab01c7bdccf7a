"""What the watchdog does about a failure, by its class: the remedy, and when to stop instead (with a verdict).

Policy, and pure: :func:`decide` reads the failure just diagnosed, the failures before it in this run, and a
:class:`Context` of facts (the GPUs, the batch, the free VRAM), and returns a :class:`Decision`. Each class's record
(:data:`.classes.CLASSES`) says its remedy, the remedy when its evidence is weak, and the exit code its stops give
(docs/watchdog.md's table is :func:`.classes.docs_table`):

- ``ladder``: the next profile of the ladder (``--fallback``); ``same``: the same profile; ``p2p-off``: the same
  profile with ``NCCL_P2P_DISABLE=1`` once (``NCCL_SHM_DISABLE=1`` when /dev/shm had no room); ``stop``: none, the
  run stops at once with a verdict (GPU out of memory: a smaller batch; the environment: the fix for the card);
- a GPU fault or hang (``gpu_side``) restarts once the GPU is released, once: the second stops, with known fixes;
  a collective's second failure stops too.

Whatever the class, the same failure (class and signature) twice at the same place (epoch, phase, batch) in two
attempts in a row, after a remedy for it, stops the run: with its class's exit code, 4 for a cause in the
environment (the GPU, its memory, the host's memory, the links between the GPUs, the software), else 5
(:data:`rocm_yolo.errors.SAME_FAILURE`), so that a scheduler does not requeue it.

**A stop needs evidence of the failure's own.** A diagnosis read from context alone (``weak``) gets the remedy
that retries (its class's ``weak_remedy``) and never stops the run, nor counts toward a later stop; a death by a
signal with no word has no signature, so it is never "the same failure".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from rocm_yolo.diagnosis import classes
from rocm_yolo.diagnosis.classes import COLLECTIVE, ENVIRONMENT, GPU_OOM, HOST_OOM, P2P_OFF, STOP
from rocm_yolo.diagnosis.record import Diagnosis
from rocm_yolo.diagnosis.vocabulary import NCCL_SHM
from rocm_yolo.gpu import known_fixes
from rocm_yolo.run.supervisor_state import Failure
from rocm_yolo.ultralytics_rules.config import TRAIN_PREFETCH

P2P_VARIABLE = "NCCL_P2P_DISABLE"
SHM_VARIABLE = "NCCL_SHM_DISABLE"  # a collective that failed for room in /dev/shm: its transport, not P2P
SAFETY = 0.8  # of the memory a smaller batch may plan to use


@dataclass(frozen=True)
class Context:
    """What the decision needs to know besides the failures."""

    archs: tuple[str, ...] = ()  # the GPUs' architectures (KFD topology)
    env: Mapping[str, str] = field(default_factory=dict)  # the run's environment (HSA_OVERRIDE_GFX_VERSION, ...)
    kernel_release: str = ""
    user_args: Mapping[str, object] = field(default_factory=dict)  # train arguments the user set (amp, conv)
    multi_gpu: bool = False
    gpus: int = 1  # GPUs the batch is split over
    batch: object = None  # the batch asked for (Ultralytics' default when the user gave none)
    imgsz: object = None
    vram_free: int | None = None  # bytes free on the card once the run released it (sysfs)
    kernel_kinds: frozenset = frozenset()  # what the kernel log said in the failure's window
    amp: object = True  # the run's amp setting (the gfx101x presets turn it off)
    memory_limit: int | None = None  # host-oom: bytes the run's cgroup allows (None: no limit, or unreadable)
    memory_total: int | None = None  # host-oom: the machine's memory (/proc/meminfo)
    cache_bytes: int | None = None  # host-oom with cache=ram: what Ultralytics' image cache holds (an estimate)
    workers: int | None = None  # host-oom: the attempt's DataLoader workers (train; validation has as many again)
    prefetch: int = TRAIN_PREFETCH  # batches each worker holds in flight (Ultralytics' prefetch_factor for training)


@dataclass(frozen=True)
class Decision:
    action: str  # LADDER, SAME, P2P_OFF or STOP
    exit_code: int | None = None  # STOP: how the run ends
    reason: str = ""  # the line that says why
    verdict: tuple[str, ...] = ()  # the known fixes, with their sources
    env: Mapping[str, str] = field(default_factory=dict)  # variables the next attempt gets

    @property
    def stops(self) -> bool:
        return self.action == STOP


def place(failure: Failure) -> str:
    """``epoch 2, batch 3`` (``validation batch 3``, ``start-up``): where a failure happened."""
    if failure.epoch is None:
        return "start-up"
    what = (
        "batch"
        if failure.phase in (None, "train")
        else f"{'validation' if failure.phase == 'val' else failure.phase} batch"
    )
    return f"epoch {failure.epoch}, {what} {failure.batch}"


def _same(a: Failure, b: Failure) -> bool:
    return (
        a.attempt == b.attempt - 1
        and a.remedy not in (None, STOP)
        and not a.weak
        and not b.weak
        and bool(b.signature)
        and (a.cls, a.signature) == (b.cls, b.signature)
        and b.epoch is not None
        and (a.epoch, a.phase, a.batch) == (b.epoch, b.phase, b.batch)
    )


def _retry(cls: str) -> Decision:
    """What a weak diagnosis gets: the remedy that retries (its class's ``weak_remedy``)."""
    action = classes.of(cls).weak_remedy
    if action == P2P_OFF:
        return Decision(P2P_OFF, env={P2P_VARIABLE: "1"}, reason=f"with {P2P_VARIABLE}=1 (a guess: {_P2P_WHY})")
    return Decision(action)


_P2P_WHY = f"RCCL's peer-to-peer off: {known_fixes.P2P_OFF.source}"


def _collective_variable(diagnosis: Diagnosis) -> tuple[str, str]:
    """The variable the next attempt gets for a collective's failure, and why: the shared-memory transport off when
    /dev/shm had no room for its segment, else peer-to-peer off."""
    if diagnosis.detail.get("word") == NCCL_SHM:
        return SHM_VARIABLE, f"the collectives' shared-memory transport off: {known_fixes.SHM_ROOM.source}"
    return P2P_VARIABLE, _P2P_WHY


def decide(failure: Failure, diagnosis: Diagnosis, previous: list[Failure], context: Context) -> Decision:
    """The remedy for ``failure`` (diagnosed as ``diagnosis``), given the ``previous`` failures of this run."""
    cls = failure.cls
    if diagnosis.weak:
        return _retry(cls)
    previous = [p for p in previous if not p.weak]  # what context suggested counts toward no stop
    record = classes.of(cls)
    if previous and _same(previous[-1], failure):
        return Decision(
            STOP,
            record.stop_exit,
            f"the same failure twice at {place(failure)}: not retrying",
            verdict(diagnosis, context),
        )
    if record.remedy == STOP:
        said = (
            oom_advice(diagnosis, context)
            if cls == GPU_OOM
            else f"{diagnosis.title}: a restart would meet it again; not retrying"
        )
        return Decision(STOP, record.stop_exit, said, verdict(diagnosis, context))
    if record.gpu_side and any(classes.of(p.cls).gpu_side for p in previous):
        return Decision(
            STOP,
            record.stop_exit,
            f"{diagnosis.title} at {place(failure)}, the second GPU failure of this run: not retrying",
            verdict(diagnosis, context),
        )
    if record.remedy == P2P_OFF:
        variable, why = _collective_variable(diagnosis)
        if any(p.cls == cls for p in previous):
            return Decision(
                STOP,
                record.stop_exit,
                f"a collective failed again at {place(failure)}, with {variable}=1: not retrying",
                verdict(diagnosis, context),
            )
        return Decision(P2P_OFF, env={variable: "1"}, reason=f"with {variable}=1 ({why})")
    if cls == HOST_OOM:  # the ladder, and what takes the memory
        return Decision(record.remedy, reason=host_memory(diagnosis, context))
    return Decision(record.remedy)


def verdict(diagnosis: Diagnosis, context: Context) -> tuple[str, ...]:
    """The known fixes for ``diagnosis`` on this machine, one line each with its public source."""
    cards = f" on {', '.join(context.archs)}" if context.archs else ""
    miopen = "MIOpen" in str(diagnosis.detail.get("word", ""))
    if diagnosis.cls == ENVIRONMENT:
        fixes = known_fixes.environment_fixes(list(context.archs), context.env, miopen=miopen, amp=context.amp)
        if "override" in diagnosis.detail:  # the override is the cause: its fix first, the card's torch after
            fixes = [known_fixes.override_fix(diagnosis.detail["card"], diagnosis.detail["override"]), *fixes]
        return (f"what makes the software run{cards}:", *(f"  - {f.line()}" for f in fixes))
    if classes.of(diagnosis.cls).gpu_side:
        fixes = known_fixes.gpu_failure_fixes(
            list(context.archs),
            context.env,
            kernel_kinds=set(context.kernel_kinds),
            kernel_release=context.kernel_release,
            user_args=context.user_args,
            page_not_present=diagnosis.detail.get("reason") == "page not present",
            multi_gpu=context.multi_gpu,
        )
        if miopen:
            fixes = [known_fixes.CONV_GEMM, *([known_fixes.AMP_OFF] if context.amp is not False else []), *fixes]
        return (f"known fixes for a {diagnosis.cls}{cards}:", *(f"  - {f.line()}" for f in fixes)) if fixes else ()
    if diagnosis.cls == COLLECTIVE:
        if diagnosis.detail.get("word") == NCCL_SHM:
            return ("what the collectives need:", f"  - {known_fixes.SHM_ROOM.line()}")
        p2p = context.env.get(P2P_VARIABLE) == "1"
        return ("known fixes for collectives that hang between consumer cards:",) + tuple(
            f"  - {f.line()}" for f in known_fixes.collective_fixes(p2p_off=p2p)
        )
    if diagnosis.cls == HOST_OOM:
        return (
            "fewer workers (--workers N, or --profile safe), cache=False, or a smaller --batch",
            f"what takes the host's memory: {host_memory(diagnosis, context)}",
        )
    return ()


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def host_memory(diagnosis: Diagnosis, context: Context) -> str:
    """Host out of memory: how much the run's cgroup allows, and what ``cache=ram``, the workers and the batch cost
    (Ultralytics' uint8 images of 3 x imgsz x imgsz: its image cache, the batches its workers hold in flight)."""
    limit = diagnosis.detail.get("limit") or context.memory_limit
    machine = f" (the machine has {_size(context.memory_total)})" if context.memory_total else ""
    parts = [f"the run's cgroup allows {_size(limit)}{machine}" if limit else f"no cgroup limit known{machine}"]
    batch, imgsz = context.batch, context.imgsz
    sized = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (batch, imgsz))
    if context.cache_bytes:
        cache = _size(context.cache_bytes)
        parts.append(f"cache=ram holds about {cache} of decoded images (cache=disk or cache=False frees it)")
    if sized and context.workers:
        held = context.workers * context.prefetch * batch * 3 * imgsz * imgsz
        parts.append(
            f"{context.workers} DataLoader workers hold {context.prefetch} batches each in flight: about {_size(held)} "
            "(validation's loader more), besides each worker's own memory (fewer --workers, or --profile safe)"
        )
    if sized:
        parts.append(f"batch {batch} at imgsz {imgsz}: {_size(batch * 3 * imgsz * imgsz * 4)} of float images a step")
    return "; ".join(parts)


def smaller_batch(batch: int, gpus: int, sizes: Mapping[str, int], vram_free: int | None) -> int | None:
    """A batch that the free VRAM suggests (a power of two per GPU, below ``batch``); None when even 1 per GPU fails.

    The memory one GPU needed at ``batch``: what PyTorch held plus what it tried to allocate (torch's message).
    The memory it may use: the card's free VRAM once the run let it go (sysfs), or else what was free plus what
    PyTorch held. The model's own memory does not shrink with the batch, so the estimate errs small.
    """
    per_gpu = max(batch // max(gpus, 1), 1)
    if per_gpu <= 1:
        return None
    need = sizes.get("allocated", 0) + sizes.get("reserved", 0) + sizes.get("tried", 0)
    usable = vram_free if vram_free else sizes.get("free", 0) + sizes.get("allocated", 0) + sizes.get("reserved", 0)
    fits = int(per_gpu * SAFETY * usable / need) if need > 0 and usable > 0 else per_gpu // 2
    fits = max(1, min(fits, per_gpu - 1))
    power = 1 << (fits.bit_length() - 1)  # round down to a power of two
    return power * max(gpus, 1)


def oom_advice(diagnosis: Diagnosis, context: Context) -> str:
    """GPU out of memory: the batch and image size that failed, and a smaller batch to try."""
    batch, imgsz = context.batch, context.imgsz
    said = f"GPU out of memory at batch {batch}, imgsz {imgsz}: not retrying the same batch"
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return said + "; give a fixed, smaller --batch"
    smaller = smaller_batch(batch, context.gpus, diagnosis.detail, context.vram_free)
    if smaller is None:
        return said + "; one image per GPU does not fit: a smaller --imgsz or a smaller --model"
    auto = "" if context.gpus > 1 else " (or batch=-1: Ultralytics picks one from the free memory)"
    return said + f"; try --batch {smaller}{auto}"
