"""End to end (issue 31): a model file that is not there is bad input, said in one line before anything starts.

It was an internal error (a rocm-yolo bug, exit 123) after a 3 s start of the training child."""

from __future__ import annotations

import pytest

from helpers import TINY, rocm_lines
from rocm_yolo import errors


@pytest.mark.quick
def test_a_missing_model_file_is_one_line_and_exit_2_with_nothing_started_or_left(cli, tiny_data, tmp_path):
    args = [a for a in TINY if a not in ("--model", "yolo26n.yaml")]
    r = cli.run("train", str(tiny_data), "--model", "/nope.pt", *args, timeout=60)
    assert r.returncode == errors.USAGE and "Traceback" not in r.stdout, r.stdout[-3000:]
    assert rocm_lines(r.stdout) == [
        "rocm-yolo: error: --model /nope.pt: no such file: give the path of a .pt checkpoint, or an Ultralytics "
        "model to download (e.g. yolo26n.pt) or to build from its config (e.g. yolo26n.yaml)"
    ]
    assert r.stdout.strip() == rocm_lines(r.stdout)[0]  # that line, and nothing else
    assert not (tmp_path / "runs").exists() and cli.leftovers() == []  # no run directory claimed, no process
