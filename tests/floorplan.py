"""The floor plan of ``rocm_yolo/``: every import between its modules, read from the source, and its cycles.

``python tests/floorplan.py`` (or ``make floorplan``) prints the import cycles among modules and among
folders, if any, and exits 1 when there is one. An import inside a function or under
``TYPE_CHECKING`` counts: it is still an import. ``tests/unit/test_layout.py`` holds the code to
the same rules. A folder is a package directory (``rocm_yolo/trainer/callbacks``); a module directly in
``rocm_yolo/`` (``cli.py``, ``errors.py``) is a room of its own; ``patches/`` is ``rocm_yolo.patches`` (pyproject's
``package-dir``), its folders ``rocm_yolo.patches.loaders`` and ``rocm_yolo.patches.saves``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name), and its file."""
    out = {}
    for base, package in ((root / "rocm_yolo", "rocm_yolo"), (root / "patches", "rocm_yolo.patches")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            parts = [package, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in known else module)
    out = set()
    for target in found:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def folder_of(name: str, files: dict[str, Path]) -> str:
    """The room of a module: its package (a package is its own), or itself for a module directly in rocm_yolo/."""
    if files[name].name == "__init__.py":
        return name
    parent = name.rpartition(".")[0]
    return name if parent == "rocm_yolo" else parent


def folder_graph(graph: dict[str, set[str]], files: dict[str, Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        room = folder_of(a, files)
        out.setdefault(room, set()).update(folder_of(b, files) for b in targets)
        out[room].discard(room)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def report(root: Path = ROOT) -> list[str]:
    """One line per cycle (with the imports that close it), empty when the plan is a DAG."""
    graph, files = module_graph(root), module_files(root)
    lines = []
    for kind, g in (("modules", graph), ("folders", folder_graph(graph, files))):
        for cycle in cycles(g):
            edges = "; ".join(f"{a} -> {b}" for a in cycle for b in sorted(g[a]) if b in cycle)
            lines.append(f"import cycle between {kind}: {', '.join(cycle)} ({edges})")
    return lines


if __name__ == "__main__":
    problems = report()
    print("\n".join(problems) if problems else "no import cycles: the modules and the folders of rocm_yolo/ form a DAG")
    sys.exit(1 if problems else 0)
