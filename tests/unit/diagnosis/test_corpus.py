"""The diagnosis measured on real failure outputs from public issue threads (tests/corpus, score.py)."""

from __future__ import annotations

from dataclasses import replace

from corpus import score
from rocm_yolo.diagnosis.diagnose import diagnose

GOAL = 0.90  # issue 30: at least 90% right, no harmful call
# Cases whose own text cannot decide their class (the thread's resolution does): said in docs/watchdog.md
UNDECIDABLE = {
    # TensorFlow's "indices[...] is not in [0, 5001)": garbage indices from rocBLAS's wrong GEMM results on gfx803
    "rocblas1172-gfx803-tensile-garbage-embedding-indices",
    # a SIGSEGV at HIP's start-up (exit 139) and nothing else: a nightly's broken HSA runtime (its InitDma)
    "strixhalo-toolbox61-nightly-hsa-initdma-segv",
}


def test_real_failures_are_named_right_and_none_gets_a_harmful_remedy():
    scores = score.score()
    labels = {s.case.label for s in scores}
    assert len(scores) >= 50 and labels >= {
        "gpu-fault", "gpu-hang", "gpu-oom", "host-oom", "loader", "collective", "environment", "data-error",
        "training-error",
    }  # fmt: skip
    right = sum(s.right for s in scores) / len(scores)
    wrong = "\n".join(f"{s.case.id} ({s.case.label}) -> {s.diagnosis.cls}" for s in scores if not s.right)
    assert right >= GOAL, f"{right:.0%} right:\n{wrong}"
    assert [s.case.id for s in scores if s.harmful and s.case.id not in UNDECIDABLE] == []


# What the text cannot decide and the machine's evidence does (docs/watchdog.md's table), with what each thread says
BEYOND = {
    "a1111-9283-rx5500xt-override-gfx1030": {"overrides": (("gfx1012", "10.3.0"),)},  # an RX 5500 XT run as gfx1030
    "rocm5824-gfx1151-override-fault": {"overrides": (("gfx1151", "11.0.0"),)},  # a Radeon 8060S run as gfx1100
    "fondue21-kraken-segtrain-worker-oom": {"cgroup_kills": 1},  # the reporter saw the OOM killer
    "fondue21-segtrain-worker-exited-oom-killer": {"cgroup_kills": 1},
    "yolov3-156-label-overflow-assert": {"labels": ("labels/a.txt:1: class id 80 out of range",)},
    "ultra8636-single-class-label-index-1": {"labels": ("labels/a.txt:1: class id 1 out of range",)},
}


def test_what_the_text_cannot_decide_the_evidence_beyond_it_does():
    cases = {c.id: c for c in score.cases()}
    for name, beyond in BEYOND.items():
        case = cases[name]
        assert diagnose(replace(case.evidence, **beyond)).cls == case.label, name


def test_every_case_has_its_thread_and_a_known_label():
    for case in score.cases():  # measured.jsonl: failures made on a lent GPU by benchmarks/gpu_acceptance.py's step 6
        assert case.source.startswith(("https://github.com/", "gpu_acceptance on ")), case.id
        assert case.label in score.LABELS, case.id


def test_the_table_in_the_docs_is_the_one_the_corpus_gives_today():
    from pathlib import Path

    docs = (Path(score.HERE).parent.parent / "docs" / "watchdog.md").read_text()
    scores = score.score()
    assert score.table(scores) in docs, "run python tests/corpus/score.py and put its table in docs/watchdog.md"
    assert score.by_set(scores) in docs, "run python tests/corpus/score.py and put its table by set in docs/watchdog.md"
