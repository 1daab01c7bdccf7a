"""Which torch is installed: its build read without importing it, and what it sees of the GPU when imported.

:func:`torch_build` reads ``torch/version.py`` with :mod:`ast` (cache keys and "is this a
ROCm build" in processes that must stay torch-free); :func:`torch_view` imports torch lazily
and never raises (the doctor and the run header).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def torch_build() -> dict:
    """torch's version, CUDA and HIP versions read from ``torch/version.py`` WITHOUT importing torch.

    Used for cache keys and "is this a ROCm build" checks in processes that must stay
    torch-free. Values are None when torch is absent or the file cannot be parsed.
    """
    info = {"torch": None, "cuda": None, "hip": None, "path": None}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return info
    info["path"] = str(next(iter(spec.submodule_search_locations)))
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            tree = ast.parse(path.read_text())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            target = value = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                key = {"__version__": "torch", "cuda": "cuda", "hip": "hip"}.get(target.id)
                if key:
                    info[key] = value.value
        break
    return info


def torch_view() -> dict:
    """What torch itself sees: versions, availability, device names and gcnArchName.

    Imports torch lazily (only when called). Safe on CPU-only machines and when torch's
    GPU initialisation fails: errors are returned under ``"error"``, never raised.
    """
    view: dict = {"torch": None, "hip": None, "cuda": None, "available": False, "devices": []}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is a finding, not a crash
        view["error"] = f"import torch failed: {type(exc).__name__}: {exc}"
        return view
    view.update(torch=torch.__version__, hip=getattr(torch.version, "hip", None), cuda=torch.version.cuda)
    try:
        view["available"] = bool(torch.cuda.is_available())
        for index in range(torch.cuda.device_count() if view["available"] else 0):
            props = torch.cuda.get_device_properties(index)
            view["devices"].append(
                {
                    "index": index,
                    "name": props.name,
                    "arch": getattr(props, "gcnArchName", None),
                    "total_memory": props.total_memory,
                }
            )
    except Exception as exc:  # noqa: BLE001
        view["error"] = f"{type(exc).__name__}: {exc}"
    return view
