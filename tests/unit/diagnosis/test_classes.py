"""One record per failure class (diagnosis/classes.py): each complete, and everything that names the classes derived
from them: the words, the remedies, the exit codes, the metrics' series, the docs' table, the corpus' labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus import score
from rocm_yolo import errors, triage
from rocm_yolo.diagnosis import classes, vocabulary
from rocm_yolo.diagnosis.classes import CLASSES, LADDER, STOP, UNKNOWN, FailureClass
from rocm_yolo.diagnosis.record import Diagnosis
from rocm_yolo.diagnosis.remedies import Context, decide
from rocm_yolo.run.supervisor_state import Failure
from rocm_yolo.supervisor.reporting import render

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("record", CLASSES, ids=lambda c: c.name)
def test_every_record_is_complete(record: FailureClass):
    assert classes.incomplete(record) == []


def test_an_incomplete_record_is_found():
    bad = FailureClass("x", "", "what", STOP, STOP, 3, "does", "stops", stop_harms=True)
    assert classes.incomplete(bad) == [
        "title",
        "weak_remedy 'stop' (a weak diagnosis retries)",
        "stop_exit 3",
        "stop_harms, and its remedy stops",
    ]


def test_the_names_are_unique_and_every_word_points_at_a_record():
    assert len(set(classes.NAMES)) == len(CLASSES)
    for word in vocabulary.WORDS:
        assert word.failure in CLASSES, word.name
    assert classes.of("no such class") is classes.named(UNKNOWN)
    with pytest.raises(KeyError):
        classes.named("no such class")


def test_every_class_but_unknown_has_its_words_and_its_corpus_cases():
    labels = {case.label for case in score.cases()}
    for record in CLASSES:
        if record.name == UNKNOWN:
            continue
        assert any(word.failure is record for word in vocabulary.WORDS), record.name
        assert record.name in labels, record.name


def _decision(record: FailureClass, weak: bool = False, previous=()):
    failure = Failure(2, "crash", record.name, record.title, f"{record.name}: x", 1, 3, "train", 0.0)
    diagnosis = Diagnosis(record.name, record.title, failure.signature, weak=weak)
    return decide(failure, diagnosis, list(previous), Context(batch=16, imgsz=640))


@pytest.mark.parametrize("record", CLASSES, ids=lambda c: c.name)
def test_the_remedies_and_the_exit_codes_are_the_records(record: FailureClass):
    assert _decision(record).action == record.remedy
    assert _decision(record, weak=True).action == record.weak_remedy
    same = Failure(1, "crash", record.name, record.title, f"{record.name}: x", 1, 3, "train", 0.0, remedy=LADDER)
    again = _decision(record, previous=[same])
    assert again.stops and again.exit_code == record.stop_exit
    if record.gpu_side:  # a second GPU failure stops, wherever it was
        other = Failure(1, "crash", record.name, record.title, "other", 9, 1, "train", 0.0, remedy=LADDER)
        assert _decision(record, previous=[other]).exit_code == record.stop_exit
    assert record.stop_exit == (errors.SETUP if record.name in classes.ENVIRONMENT_CLASSES else errors.SAME_FAILURE)


def test_the_metrics_have_a_series_per_record():
    text = render("/run", None, "running", {}, 1, now=0.0)
    assert [line.split('class="')[1].split('"')[0] for line in text.splitlines() if 'class="' in line] == list(
        classes.NAMES
    )


def test_the_docs_table_is_the_records():
    docs = (ROOT / "docs" / "watchdog.md").read_text()
    assert classes.docs_table() in docs, "put classes.docs_table() into docs/watchdog.md"


def test_triage_reads_the_gpu_runtimes_words_from_the_vocabulary():
    for message in ("HIP error: invalid device function", "CUDA error: unknown error", "miopenStatusUnknownError"):
        assert triage.classify(RuntimeError(message)).kind == triage.ENVIRONMENT, message
    assert triage.classify(AssertionError("Torch not compiled with CUDA enabled")).kind == triage.ENVIRONMENT
    assert triage.classify(RuntimeError("DataLoader worker (pid 3) exited unexpectedly")).kind != triage.ENVIRONMENT
    assert all(word.failure.gpu_runtime for word in vocabulary.GPU_RUNTIME)
