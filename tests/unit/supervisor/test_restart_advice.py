"""The resume advice in the user's language: the command line for ``rocm-yolo``, Python for ``rocm_yolo.train``."""

from __future__ import annotations

import ast
from dataclasses import replace

from rocm_yolo.run.events import FROM_PYTHON
from rocm_yolo.run.nodes import Nodes
from rocm_yolo.supervisor.restart import resume_command


def from_python(spec) -> str:
    token = FROM_PYTHON.set(True)  # as rocm_yolo.train sets it for its call
    try:
        return resume_command(spec)
    finally:
        FROM_PYTHON.reset(token)


def test_the_command_line_gets_the_command(spec):
    assert resume_command(spec) == f"rocm-yolo train --resume {spec.paths.last}"


def test_python_gets_a_call_it_can_run(spec):
    call = ast.parse(from_python(spec), mode="eval").body  # rocm_yolo.train(resume='.../last.pt')
    assert ast.unparse(call.func) == "rocm_yolo.train" and not call.args
    assert [(k.arg, k.value.value) for k in call.keywords] == [("resume", str(spec.paths.last))]


def test_on_several_machines_every_node_resumes_with_its_node_options(spec):
    nodes = replace(spec, nodes=Nodes(count=2, node=0, endpoint="h:29400", source="flags"))
    assert resume_command(nodes).endswith("and the same node flags, on every node")
    advice = from_python(nodes)
    assert advice.startswith("rocm_yolo.train(resume=") and "nnodes=, node_rank=, rdzv_endpoint=" in advice


def test_a_run_name_with_shell_syntax_is_quoted_so_a_copied_line_runs_nothing(spec, tmp_path):
    """A run named ``x$(touch pwned)`` (a name anyone could give a shared project's folder): the advice, pasted into a
    shell, passes the path as one argument and runs nothing (issue 45)."""
    import os
    import shlex
    import subprocess

    run = tmp_path / "runs" / "x$(touch pwned);`touch pwned2` 'q'"
    advice = resume_command(replace(spec, run_dir=str(run)))
    assert shlex.split(advice) == ["rocm-yolo", "train", "--resume", str(run / "weights" / "last.pt")]
    shown = subprocess.run(
        ["sh", "-c", "printf '%s\\n' " + advice.removeprefix("rocm-yolo ")], cwd=tmp_path, capture_output=True
    )
    assert shown.stdout.decode().splitlines()[-1] == str(run / "weights" / "last.pt")
    assert not any(name.startswith("pwned") for name in os.listdir(tmp_path))
