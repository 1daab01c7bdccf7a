"""The docs held against the code, as black's ``test_docs`` does: what a newcomer reads must be what is there.

The package maps (each package's docstring), every ``:mod:`` reference, CONTRIBUTING's tree, its
patch list, its fault list, the paths its picture of the roles and its table name, and the run directory in
docs/watchdog.md.
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


def _a_path_of_the_house(path: str) -> bool:
    """``path`` as CONTRIBUTING names it (``trainer/forkserver/``, ``conv/probe.py``, ``trainer/rank``): a file or
    folder of the repository, of ``rocm_yolo/`` or of ``patches/`` (a module without its ``.py`` too)."""
    path = path.rstrip("/")
    return any(
        (base / path).exists() or (base / f"{path}.py").is_file()
        for base in (ROOT, ROOT / "rocm_yolo", ROOT / "patches")
    )


def test_contributings_picture_of_the_roles_names_what_is_there():
    """The picture of the six process roles: each role numbered, every module it starts (``python -m ...``) and every
    path it names (``trainer/forkserver/``, ``conv/selftest.py``) is there."""
    block = CONTRIBUTING.split("The six process roles", 1)[1].split("```", 2)[1]
    started = re.findall(r"python -m ([\w.]+)", block)
    named = re.findall(r"(?<![\w./-])((?:\w+/)+(?:\w+(?:\.py)?)?)", block)
    assert {int(n) for n in re.findall(r"\s([1-9])\. ", block)} == {1, 2, 3, 4, 5, 6}
    assert started and named
    assert [name for name in started if name not in FILES] == []
    assert [path for path in named if not _a_path_of_the_house(path)] == []


def test_contributings_table_of_where_to_change_what_names_what_is_there():
    """Every path in the table of where to change what (``policy/profiles.py``, ``ultralytics_rules/``) is there."""
    table = CONTRIBUTING.split("Where to change what", 1)[1].split("\n\n", 2)[1]
    named = re.findall(r"`((?:[\w.]+/)+[\w.]*)`", table)
    assert len(named) > 20
    assert [path for path in named if not _a_path_of_the_house(path)] == []


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


# A measured figure: a time, a size or a rate with a decimal point or thousands (settings are whole numbers: 180 s,
# 64 MB, 10 minutes), a ratio (1.12x, 12x), a share with a decimal point (0.09%). Code spans and blocks are commands
# and quoted output, not claims.
_UNIT = r"(?:s|ms|µs|us|min|minutes?|seconds?|h|hours?|B|KB|KiB|MB|MiB|GB|GiB|TB|it/s|images/s)"
_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)"
FIGURE = re.compile(rf"(?<![\w.])(?:{_NUM}\s?{_UNIT}(?![\w/])|\d+(?:\.\d+)?x(?!\w)|\d+\.\d+%)")
# Where a figure comes from: the command that measures it, a lent GPU's report, v0.1 (measured by it: not again), or
# a figure quoted from elsewhere, said so.
PROVENANCE = re.compile(
    r"python3?\s+benchmarks/\w+\.py|\bmake (?:demo|test|test-all|check)\b|docs/gpu/|\]\(gpu/[\w.-]+\.md"
    r"|\bv0\.1\b|not measured here"
)
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s")


def _paragraphs(text: str) -> list[tuple[str, str]]:
    """(a paragraph, a list item or a table, the text it is read with): a list item with the lines before its list,
    a table with the paragraph before it (its caption). Code blocks are left out."""
    blocks, current, fence = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        if fence or line.lstrip().startswith("#"):
            continue
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    blocks += [current] if current else []
    out, before = [], ""
    for lines in blocks:
        if lines[0].lstrip().startswith("|"):
            table = "\n".join(lines)
            out.append((table, table + "\n" + before))
            continue
        lead, items = [], []
        for line in lines:
            if _ITEM.match(line):
                items.append([line])
            elif items:
                items[-1].append(line)
            else:
                lead.append(line)
        head = "\n".join(lead)
        out += [(head, head)] if head else []
        out += [("\n".join(item), "\n".join(item) + "\n" + head) for item in items]
        before = "\n".join(lines)
    return out


def test_every_measured_figure_names_its_command_its_report_or_its_source():
    """Issue 43: a time, a size, a rate or a ratio in README.md or docs/*.md sits in a paragraph or table that names
    the command that measured it (``python benchmarks/...``, ``make ...``) or a lent GPU's report in docs/gpu/; a
    figure of v0.1 or of someone else's measurement says so."""
    unsourced = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for text, read_with in _paragraphs(doc.read_text()):
            figures = FIGURE.findall(re.sub(r"`[^`]*`", "", text))
            if figures and not PROVENANCE.search(read_with):
                unsourced.append(f"{doc.name}: {', '.join(figures[:4])}: {text[:100]!r}")
    assert unsourced == []
