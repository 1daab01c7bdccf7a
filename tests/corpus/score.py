"""The diagnosis measured on real failures: each case of the corpus, as the watchdog would gather it, diagnosed.

The corpus (``failures.jsonl``: the starting set of ../shared/corpus; ``gathered.jsonl``, ``heldout.jsonl``,
``heldout2.jsonl`` and ``heldout3.jsonl``: sets gathered later by readers who had not seen the rules, each scored once
before it was read, docs/watchdog.md) holds failure outputs copied verbatim from public issue threads, each with the
thread's address and the class its resolution supports; ``measured.jsonl`` holds failures made on a lent GPU by
benchmarks/gpu_acceptance.py (its step 6), each with the machine and the fault that made it. A case becomes
:class:`Evidence` as the watchdog gathers it: the post's kernel-log lines (dmesg's, amdgpu's, the OOM killer's) as
the kernel log of the run's processes and cards, the rest as the child's stderr and traceback, the exit status as
the post shows it; a post without a kernel line is taken as a machine whose kernel log cannot be read (a container),
where most come from.

A call is **harmful** when its remedy does harm (each class's record says which: ``stop_harms``, ``ladder_harms``): a
loader, data, training or host-memory failure called a class that stops the run at once, or a GPU or environment
failure sent down the loader ladder.

``python tests/corpus/score.py`` prints the table by set and the per-class table (docs/watchdog.md holds both), each
set's own per-class table, and each wrong call.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run as a script from anywhere: the checkout's rocm_yolo

from rocm_yolo.diagnosis.classes import CLASSES, LADDER  # noqa: E402
from rocm_yolo.diagnosis.diagnose import diagnose  # noqa: E402
from rocm_yolo.diagnosis.record import Diagnosis, Evidence  # noqa: E402
from rocm_yolo.diagnosis.remedies import Context, decide  # noqa: E402
from rocm_yolo.gpu import kernel_log  # noqa: E402
from rocm_yolo.run.supervisor_state import Failure  # noqa: E402

FILES = ("failures.jsonl", "gathered.jsonl", "heldout.jsonl", "heldout2.jsonl", "heldout3.jsonl", "measured.jsonl")
CALM = tuple(c.name for c in CLASSES if c.stop_harms)  # failures a retry may cure: never stopped at once
GPU_SIDE = tuple(c.name for c in CLASSES if c.ladder_harms)  # failures a lighter loader cannot cure
LABELS = tuple(c.name for c in CLASSES if c.name != "unknown")  # what a case's resolution may say it was
_DMESG = re.compile(r"^\s*\[\s*\d+\.\d+\]")


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    label: str
    file: str
    evidence: Evidence


def evidence(case: dict) -> Evidence:
    """What the watchdog would have gathered of the failure the post shows."""
    lines = case["text"].splitlines()
    kernel = [x for x in lines if _DMESG.match(x) or kernel_log.kinds(x)]
    rest = "\n".join(x for x in lines if x not in kernel)
    found = kernel_log.events(kernel_log.parse("\n".join(kernel), boot=0.0))
    pids = {pid for event in found for pid in event.pids}
    cards = {event.card for event in found if event.card}
    ours = kernel_log.attribute(found, pids, cards)
    code = case.get("exit")
    # the child writes a Python crash's traceback apart (a post cut above it shows the final error); a process killed
    # by a signal writes none
    start = max(rest.rfind("Traceback (most recent call last)"), 0) if not (isinstance(code, int) and code < 0) else -1
    return Evidence(
        failure=case["failure"],
        exit_code=code if isinstance(code, int) else (1 if case["failure"] == "crash" else None),
        stderr=rest,
        traceback=rest[start:] if start >= 0 and case["failure"] == "crash" else "",
        kernel=tuple(line for event in ours.run for line in event.lines),
        kernel_context=tuple(line for event in ours.unnamed for line in event.lines),
        kernel_source="the post's kernel lines" if kernel else "kernel log not readable (none in the post)",
        pids=frozenset(pids),
        multi_gpu=bool(case.get("multi_gpu")),
        on_gpu=bool(case.get("on_gpu")),
        launcher=rest if case.get("multi_gpu") else "",
    )


def cases(files=FILES) -> list[Case]:
    out = []
    for name in files:
        path = HERE / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out.append(Case(row["id"], row["source"], row["label"], name, evidence(row)))
    return out


def harmful(label: str, diagnosis: Diagnosis) -> bool:
    """Whether acting on ``diagnosis`` harms a failure whose real class is ``label`` (its first occurrence)."""
    record = Failure(1, "crash", diagnosis.cls, diagnosis.title, diagnosis.signature, 1, 1, "train", 0.0)
    decision = decide(record, diagnosis, [], Context(gpus=1, batch=16, imgsz=640))
    return (label in CALM and decision.stops) or (label in GPU_SIDE and decision.action == LADDER)


@dataclass(frozen=True)
class Score:
    case: Case
    diagnosis: Diagnosis

    @property
    def right(self) -> bool:
        return self.diagnosis.cls == self.case.label

    @property
    def harmful(self) -> bool:
        return harmful(self.case.label, self.diagnosis)


def score(files=FILES) -> list[Score]:
    return [Score(c, diagnose(c.evidence)) for c in cases(files)]


def table(scores: list[Score]) -> str:
    """The per-class markdown table: cases, right, harmful, and the classes the wrong calls got."""
    labels = sorted({s.case.label for s in scores})
    rows = ["| class | cases | right | harmful | wrong calls |", "|---|---|---|---|---|"]
    for label in labels:
        mine = [s for s in scores if s.case.label == label]
        wrong = sorted(s.diagnosis.cls for s in mine if not s.right)
        rows.append(
            f"| {label} | {len(mine)} | {sum(s.right for s in mine)} | {sum(s.harmful for s in mine)} | "
            f"{', '.join(wrong) or '-'} |"
        )
    right = sum(s.right for s in scores)
    rows.append(
        f"| **all** | {len(scores)} | {right} ({100 * right / max(len(scores), 1):.0f}%) | "
        f"{sum(s.harmful for s in scores)} | |"
    )
    return "\n".join(rows)


def by_set(scores: list[Score]) -> str:
    """The markdown table by set: each file's cases, right and harmful calls."""
    rows = ["| set | cases | right | harmful |", "|---|---|---|---|"]
    for name in FILES:
        mine = [s for s in scores if s.case.file == name]
        if mine:
            right, harm = sum(s.right for s in mine), sum(s.harmful for s in mine)
            rows.append(f"| `{name}` | {len(mine)} | {right} ({100 * right / len(mine):.0f}%) | {harm} |")
    return "\n".join(rows)


def main() -> int:
    print(f"by set:\n{by_set(score())}")
    for name in FILES:
        scores = score((name,))
        if scores:
            print(f"\n{name}:\n{table(scores)}")
    scores = score()
    print(f"\nall:\n{table(scores)}\n")
    for s in scores:
        if not s.right:
            print(f"wrong: {s.case.id} ({s.case.label}) -> {s.diagnosis.cls}: {s.diagnosis.title[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
