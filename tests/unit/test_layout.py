"""The house: which side of the process boundary each module is on, and the size rules it keeps.

The supervisor side (the CLI, the launcher, the supervisor, status, the doctor, the shared
contract in ``run/``) never imports torch; only the training child (``trainer/``), the
patches it installs and the conv self-test's child (``conv/probe``) do.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import rocm_yolo

ROOT = Path(rocm_yolo.__file__).resolve().parent.parent
TORCH_SIDE = ("rocm_yolo.trainer", "rocm_yolo.patches", "rocm_yolo.conv.probe", "rocm_yolo.testing")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(rocm_yolo.__path__, "rocm_yolo.") if not m.name.endswith(".__main__")
    )


def supervisor_side() -> list[str]:
    return [m for m in modules() if not m.startswith(TORCH_SIDE)]


def imported_after_each(names: list[str], heavy: tuple[str, ...]) -> dict:
    """Import ``names`` in order in a fresh interpreter; for each, the heavy modules loaded by then."""
    code = (
        "import importlib, json, sys\n"
        f"out = {{}}\nfor name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"    out[name] = [m for m in {heavy!r} if m in sys.modules]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_module_of_the_supervisor_side_imports_without_torch():
    names = supervisor_side()
    assert "rocm_yolo.supervisor.loop" in names and "rocm_yolo.doctor.cli" in names and len(names) > 30
    found = imported_after_each(names, ("torch", "ultralytics"))
    first = next((name for name in names if found[name]), None)
    assert first is None, f"{first} imports {found[first]}"


def test_the_cli_and_the_trainers_entry_import_nothing_heavy():
    """``rocm-yolo --help`` answers at once; the child sets spawn before torch comes in."""
    names = [
        "rocm_yolo.cli",
        "rocm_yolo.launch",
        "rocm_yolo.supervisor.loop",
        "rocm_yolo.status",
        "rocm_yolo.trainer.child",
        "rocm_yolo.trainer.launcher",  # on several GPUs the child only launches the ranks: no torch in it
        "rocm_yolo.trainer.ranks",
    ]
    found = imported_after_each(names, ("torch", "ultralytics", "cv2", "numpy"))
    assert all(found[name] == [] for name in names), found


def test_testing_hooks_are_imported_only_when_asked_for(tmp_path):
    """Production code, the fork server's preload included, never imports rocm_yolo.testing on its own."""
    code = (
        "import os, sys\n"
        "for var in ('ROCM_YOLO_FAULT', 'ROCM_YOLO_RECORD_BATCHES'): os.environ.pop(var, None)\n"
        "import rocm_yolo.trainer.run, rocm_yolo.trainer.preload, rocm_yolo.conv.probe, rocm_yolo.patches.dataloader\n"
        "from rocm_yolo.run import hooks\n"
        "hooks.arm_worker(None, None); hooks.conv_fault('native'); assert hooks.trainer_callbacks(None, 1) == []\n"
        "print(sorted(m for m in sys.modules if m.startswith('rocm_yolo.testing')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "[]"


def test_pyproject_lists_every_package():
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)\]", text, re.S | re.M)[1]
    listed = set(re.findall(r'"(rocm_yolo(?:\.\w+)*)"', block))
    folders = {"rocm_yolo"} | {m for m in modules() if (ROOT / m.replace(".", "/") / "__init__.py").is_file()}
    assert listed == folders | {"rocm_yolo.patches"}


def test_modules_and_functions_stay_short():
    long = []
    for path in sorted(list((ROOT / "rocm_yolo").rglob("*.py")) + list((ROOT / "patches").glob("*.py"))):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert long == []
