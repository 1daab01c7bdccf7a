"""The docs held against the code, as black's ``test_docs`` does: what a newcomer reads must be what is there.

The package maps (each package's docstring), every ``:mod:`` reference, CONTRIBUTING's tree, its
patch list and its fault list, and the run directory in docs/watchdog.md.
"""

from __future__ import annotations

import inspect
import itertools
import re
from pathlib import Path

import floorplan
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.testing import faults

ROOT = floorplan.ROOT
FILES = floorplan.module_files()
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
MOD = re.compile(r":mod:`~?([\w.]+)`")


def docstring(path: Path) -> str:
    text = path.read_text()
    return text[: text.find('"""', 3) + 3] if text.startswith('"""') else ""


def test_each_package_map_names_each_of_its_modules():
    missing, unknown = [], []
    for name, path in FILES.items():
        if path.name != "__init__.py":
            continue
        doc = docstring(path)
        own = {m.rpartition(".")[2] for m in FILES if m.rpartition(".")[0] == name and m != name}
        own.discard("__main__")
        named = {ref.lstrip(".") for ref in MOD.findall(doc) if ref.startswith(".") and "." not in ref[1:]}
        missing += [f"{name}.{m}" for m in sorted(own - named)]
        unknown += [f"{name}: .{m}" for m in sorted(named - own)]
    assert missing == [] and unknown == []


def test_every_mod_reference_resolves():
    broken = []
    for name, path in FILES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for ref in MOD.findall(path.read_text()):
            target = package + ref if ref.startswith(".") else ref
            if target.startswith("rocm_yolo") and target not in FILES:
                broken.append(f"{path.relative_to(ROOT)}: {ref}")
    assert broken == []


def test_contributings_tree_is_the_package_tree():
    block = CONTRIBUTING.split("## The house", 1)[1].split("```", 2)[1]
    listed, parents = set(), []
    for line in block.splitlines():
        m = re.match(r"^( *)([\w.]+)/ ", line + " ")
        if not m or m.group(2) in ("rocm_yolo", "tests", "benchmarks", "patches"):
            continue
        depth = len(m.group(1)) // 2 - 1  # under rocm_yolo/
        parents[depth:] = [m.group(2)]
        listed.add(".".join(["rocm_yolo", *parents]))
    packages = {
        name for name, path in FILES.items() if path.name == "__init__.py" and name.count(".") and "patches" not in name
    }
    assert listed == packages


def test_contributings_patch_list_is_the_patches():
    """The tree's ``patches/`` entry (its line and the lines under it), after its first colon, parentheses aside:
    ``module; folder: module, module; ...``, every module and folder of rocm_yolo.patches."""
    lines = CONTRIBUTING.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("patches/"))
    entry = " ".join([lines[start], *itertools.takewhile(lambda x: x.startswith(" " * 28), lines[start + 1 :])])
    listed = set()
    for group in re.sub(r"\([^)]*\)", "", entry.split(":", 1)[1]).split(";"):
        folder, _, names = (x.strip() for x in group.rpartition(":"))
        listed |= {f"{folder}.{n}" if folder else n for n in names.replace(",", " ").split()} | ({folder} - {""})
    patches = {m[len("rocm_yolo.patches.") :] for m in FILES if m.startswith("rocm_yolo.patches.")}
    assert listed == patches


def test_contributing_names_every_fault():
    hooks = CONTRIBUTING.split("## Testing hooks", 1)[1].split("\n## ", 1)[0]
    assert [kind for kind in faults.KINDS if f"`{kind}@" not in hooks and f"`{kind}`" not in hooks] == []


def _run_files() -> set[str]:
    """The name of every file and folder RunPaths gives a run (one machine's, and a node's of several), with numbers
    as \\d+ (patterns)."""
    names = set()
    skip = ("run_dir", "node", "checkpoints", "specs", "mid_checkpoints", "rank_heartbeats", "nodes", "for_node")
    for paths in (RunPaths("/run", None), RunPaths("/run", 1)):
        for attr, value in vars(RunPaths).items():
            if attr.startswith("_") or attr in skip:
                continue
            if isinstance(value, property):
                names.add(getattr(paths, attr).name)
            elif callable(value):
                args = [1 for p in list(inspect.signature(value).parameters)[1:]]
                if attr == "fault_fired":
                    args = ["crash"]
                names.add(value(paths, *args).name)
    return names


def test_the_run_directory_in_the_docs_lists_every_file_a_run_keeps():
    docs = (ROOT / "docs" / "watchdog.md").read_text().split("## Run directory", 1)[1]
    undocumented = []
    for name in sorted(_run_files()):
        pattern = re.escape(name).replace("1", r"\d+").replace("crash", r"[\w-]+") if "fault" in name else None
        pattern = pattern or re.escape(name).replace("1", r"\d+")
        if not re.search(pattern, docs):
            undocumented.append(name)
    assert undocumented == []


def test_the_docs_name_only_modules_and_files_that_exist():
    """Every ``rocm_yolo/...py`` path and ``rocm_yolo.x.y`` name in the Markdown docs is a file, a module, or a
    name a module defines."""
    import importlib

    broken = []
    for doc in [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]:
        text = doc.read_text()
        for path in re.findall(r"\brocm_yolo/[\w/]+\.py\b", text):
            if not (ROOT / path).is_file():
                broken.append(f"{doc.name}: {path}")
        for dotted in set(re.findall(r"\brocm_yolo(?:\.\w+)+", text)):
            module, _, attr = dotted.rpartition(".")
            if dotted in FILES or dotted == "rocm_yolo.train":
                continue
            if module not in FILES or not hasattr(importlib.import_module(module), attr):
                broken.append(f"{doc.name}: {dotted}")
    assert sorted(broken) == []
