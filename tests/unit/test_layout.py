"""The house: which side of the process boundary each module is on, its floor plan, and the size rules it keeps.

The supervisor side (the CLI, the launcher, the supervisor, status, the doctor, the shared
contract in ``run/``) never imports torch; only the training child (``trainer/``), the
patches it installs and the conv patch and self-test's child (``conv/patch``, ``conv/probe``) do.
The imports form a DAG, among modules and among folders (``tests/floorplan.py``, ``make floorplan``).
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import floorplan
import rocm_yolo

ROOT = Path(rocm_yolo.__file__).resolve().parent.parent
TORCH_SIDE = (
    "rocm_yolo.trainer",
    "rocm_yolo.patches",
    "rocm_yolo.conv.probe",
    "rocm_yolo.conv.patch",
    "rocm_yolo.testing",
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_MODULES_PER_FOLDER = 12  # not counting __init__ and __main__
SHARED_NAMES = {"__init__", "__main__", "cli", "config"}  # module names a package may have of its own


def modules() -> list[str]:
    """Every module, the patches included: mapped in from patches/, they are not on ``rocm_yolo.__path__``."""
    import rocm_yolo.patches

    found = [
        *pkgutil.walk_packages(rocm_yolo.__path__, "rocm_yolo."),
        *pkgutil.walk_packages(rocm_yolo.patches.__path__, "rocm_yolo.patches."),
    ]
    return sorted({"rocm_yolo.patches"} | {m.name for m in found if not m.name.endswith(".__main__")})


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
        "rocm_yolo.request",
        "rocm_yolo.supervisor.loop",
        "rocm_yolo.status",
        "rocm_yolo.trainer.entry",
        "rocm_yolo.ddp.launcher",  # on several GPUs the supervisor's child only launches the ranks: no torch in it
        "rocm_yolo.trainer.rank",
    ]
    found = imported_after_each(names, ("torch", "ultralytics", "cv2", "numpy"))
    assert all(found[name] == [] for name in names), found


def test_testing_hooks_are_imported_only_when_asked_for(tmp_path):
    """Production code, the fork server's preload included, never imports rocm_yolo.testing on its own: not even
    with a fault asked for, unless the plugin is named (rocm_yolo.run.hooks)."""
    code = (
        "import os, sys\n"
        "os.environ.pop('ROCM_YOLO_PLUGINS', None); os.environ['ROCM_YOLO_FAULT'] = 'worker-hang'\n"
        "import rocm_yolo.trainer.training, rocm_yolo.trainer.forkserver.preload, rocm_yolo.conv.probe\n"
        "import rocm_yolo.patches.loaders.dataloader\n"
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
    files = floorplan.module_files()
    folders = {m for m in modules() if m in files and files[m].name == "__init__.py"}
    assert listed == {"rocm_yolo"} | folders


def test_the_patches_live_in_patches_and_a_checkout_without_an_install_finds_them(tmp_path):
    """patches/ at the top is rocm_yolo.patches: mapped in by pyproject's package-dir (a wheel, an editable install),
    no link; and a checkout on sys.path with no install at all (``python -S``: no site-packages, no editable
    finder) finds it too, as ``python -m`` in the clone puts the checkout before an installed wheel."""
    assert not (ROOT / "rocm_yolo" / "patches").exists()
    assert re.search(
        r'^package-dir = \{ *"rocm_yolo\.patches" = "patches" *\}', (ROOT / "pyproject.toml").read_text(), re.M
    )
    code = (
        "import rocm_yolo.patches.swap, rocm_yolo.patches.saves, rocm_yolo.patches.loaders as p; print(p.__path__[0])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(ROOT / "patches" / "loaders")]


def test_modules_and_functions_stay_short():
    long = []
    for path in sorted(list((ROOT / "rocm_yolo").rglob("*.py")) + list((ROOT / "patches").rglob("*.py"))):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert long == []


def test_the_imports_form_a_dag_among_modules_and_among_folders():
    assert floorplan.report() == []


def test_the_floor_plan_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check itself: a cycle between two modules, one of its imports inside a function, and the folder cycle
    it makes, are both found (an import under TYPE_CHECKING or in a function is still an import)."""
    (tmp_path / "rocm_yolo" / "a").mkdir(parents=True)
    (tmp_path / "rocm_yolo" / "b").mkdir()
    (tmp_path / "patches").mkdir()
    for folder in ("rocm_yolo", "rocm_yolo/a", "rocm_yolo/b"):
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "rocm_yolo" / "a" / "x.py").write_text("from rocm_yolo.b import y\n")
    (tmp_path / "rocm_yolo" / "b" / "y.py").write_text("def f():\n    from rocm_yolo.a.x import g\n")
    found = floorplan.report(tmp_path)
    assert [line.split(":")[0] for line in found] == ["import cycle between modules", "import cycle between folders"]
    assert "rocm_yolo.a.x, rocm_yolo.b.y" in found[0] and "rocm_yolo.a, rocm_yolo.b" in found[1]


def test_the_shared_contract_depends_only_on_the_bottom_of_the_house():
    """run/ is what both processes share: it imports nothing of ours but itself, errors and environment; nothing
    in rocm_yolo imports the testing plugin, and only the trainer side and testing import patches."""
    graph = floorplan.module_graph()
    allowed = ("rocm_yolo.run", "rocm_yolo.errors", "rocm_yolo.environment")
    outside = {
        (a, b) for a, bs in graph.items() if a.startswith("rocm_yolo.run") for b in bs if not b.startswith(allowed)
    }
    assert outside == set()
    testing = {a for a, bs in graph.items() if any(b.startswith("rocm_yolo.testing") for b in bs)}
    assert {a for a in testing if not a.startswith("rocm_yolo.testing")} == set()


def test_no_folder_holds_more_than_twelve_modules():
    files = floorplan.module_files()
    sizes: dict[Path, int] = {}
    for name, path in files.items():
        if path.stem not in ("__init__", "__main__"):
            sizes[path.parent] = sizes.get(path.parent, 0) + 1
    assert {str(f.relative_to(ROOT)): n for f, n in sizes.items() if n > MAX_MODULES_PER_FOLDER} == {}


def test_a_modules_name_says_what_it_holds_and_is_its_own():
    """No module name in two folders (but a package's own cli.py or config.py), and none named after a folder of
    the package (trainer/run.py beside the run/ package read as one)."""
    files = floorplan.module_files()
    folders = {path.parent.name for path in files.values()}
    seen: dict[str, list[str]] = {}
    for name, path in files.items():
        if path.stem not in SHARED_NAMES:
            seen.setdefault(path.stem, []).append(name)
    assert {stem: names for stem, names in seen.items() if len(names) > 1} == {}
    assert sorted(stem for stem in seen if stem in folders) == []
