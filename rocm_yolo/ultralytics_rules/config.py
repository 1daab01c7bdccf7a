"""Ultralytics' train arguments, read without importing Ultralytics (which imports torch).

``rocm-yolo train ... KEY=VALUE`` is checked against Ultralytics' ``cfg/default.yaml`` (the
valid keys) and the typed key sets in ``cfg/__init__.py`` (``CFG_INT_KEYS`` and friends),
read from the installed package's source files with :mod:`ast`. So a misspelt key or a
wrong type is a one-line error before any process starts, and the CLI stays fast.
The child still runs Ultralytics' own ``check_cfg`` when training starts.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.errors import UsageError

# The batches each DataLoader worker of a training loader holds in flight: ``build_dataloader``'s prefetch_factor
# when it shuffles (ultralytics/data/build.py; not in cfg/default.yaml)
TRAIN_PREFETCH = 4


@dataclass(frozen=True)
class UltralyticsConfig:
    defaults: dict
    int_keys: frozenset
    float_keys: frozenset
    fraction_keys: frozenset
    bool_keys: frozenset
    str_keys: frozenset
    task2model: dict
    version: str


def package_dir() -> Path:
    spec = importlib.util.find_spec("ultralytics")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("ultralytics is not installed: pip install ultralytics")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def load() -> UltralyticsConfig:
    import yaml

    root = package_dir()
    defaults = yaml.safe_load((root / "cfg" / "default.yaml").read_text(encoding="utf-8"))
    sets: dict[str, object] = {}
    tree = ast.parse((root / "cfg" / "__init__.py").read_text(encoding="utf-8"))
    wanted = {"CFG_INT_KEYS", "CFG_FLOAT_KEYS", "CFG_FRACTION_KEYS", "CFG_BOOL_KEYS", "CFG_STR_KEYS", "TASK2MODEL"}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name not in wanted:
                continue
            value = node.value
            if isinstance(value, ast.Call) and value.args:  # frozenset({...})
                value = value.args[0]
            try:
                sets[name] = ast.literal_eval(value)
            except ValueError:
                pass
    version = ""
    init = (root / "__init__.py").read_text(encoding="utf-8")
    for line in init.splitlines():
        if line.startswith("__version__"):
            version = line.split("=", 1)[1].strip().strip("\"'")
            break
    return UltralyticsConfig(
        defaults=defaults,
        int_keys=frozenset(sets.get("CFG_INT_KEYS", ())),
        float_keys=frozenset(sets.get("CFG_FLOAT_KEYS", ())),
        fraction_keys=frozenset(sets.get("CFG_FRACTION_KEYS", ())),
        bool_keys=frozenset(sets.get("CFG_BOOL_KEYS", ())),
        str_keys=frozenset(sets.get("CFG_STR_KEYS", ())),
        task2model=dict(sets.get("TASK2MODEL", {"detect": "yolo26n.pt"})),
        version=version,
    )


# The expressions Ultralytics' list of downloadable model names is built from (string constants, f-strings, list
# comprehensions, frozenset): evaluated only when made of these, with no builtins but frozenset.
_ASSET_NODES = (
    ast.Expression, ast.Call, ast.Name, ast.Load, ast.Store, ast.BinOp, ast.Add, ast.List, ast.Tuple, ast.ListComp,
    ast.comprehension, ast.JoinedStr, ast.FormattedValue, ast.Constant,
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def asset_names() -> frozenset | None:
    """The model files Ultralytics downloads by name from its assets release (``GITHUB_ASSETS_NAMES`` of
    ``utils/downloads.py``), read from the source without importing it; None where it cannot be read."""
    try:
        tree = ast.parse((package_dir() / "utils" / "downloads.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UsageError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["GITHUB_ASSETS_NAMES"]:
            expression = ast.Expression(node.value)
            names = {n.id for n in ast.walk(expression) if isinstance(n, ast.Name)}
            if not all(isinstance(n, _ASSET_NODES) for n in ast.walk(expression)) or "__import__" in names:
                return None
            try:
                found = eval(compile(expression, "downloads.py", "eval"), {"__builtins__": {}, "frozenset": frozenset})
            except Exception:  # noqa: BLE001 - another Ultralytics' shape: no list, no refusal
                return None
            return frozenset(found) if isinstance(found, (set, frozenset)) else None
    return None


def default(key: str) -> object:
    """Ultralytics' default of train argument ``key``, from its ``cfg/default.yaml`` (e.g. batch 16, imgsz 640)."""
    return load().defaults[key]


def smart_value(text: str) -> object:
    """Ultralytics' KEY=VALUE value conversion (``ultralytics.cfg.smart_value``): none/true/false, literals, text."""
    low = text.lower()
    if low == "none":
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text


def _close(key: str, candidates) -> str:
    import difflib

    match = difflib.get_close_matches(key, list(candidates), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def finite(value: object) -> bool:
    """False for a float that is inf or nan, or a list or tuple holding one (``batch=1e999`` reads as inf)."""
    if isinstance(value, (list, tuple)):
        return all(finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def check_train_arg(key: str, value: object, extra_keys=()) -> object:
    """Validate one Ultralytics train argument as Ultralytics' check_cfg would; return the value to use."""
    cfg = load()
    if key not in cfg.defaults:
        raise UsageError(f"'{key}' is not a valid Ultralytics argument{_close(key, [*cfg.defaults, *extra_keys])}")
    if not finite(value):
        raise UsageError(f"'{key}={value}' is not a finite number: give a number such as {cfg.defaults.get(key) or 1}")
    if value is None:
        if cfg.defaults.get(key) is not None and key in (cfg.int_keys | cfg.float_keys | cfg.bool_keys | cfg.str_keys):
            raise UsageError(f"'{key}=None' is invalid: '{key}' needs a value")
        return value
    if key in cfg.bool_keys and not isinstance(value, bool):
        raise UsageError(f"'{key}={value}' is not a boolean: use {key}=True or {key}=False")
    if key in cfg.int_keys and (isinstance(value, bool) or not isinstance(value, int)):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UsageError(f"'{key}={value}' is not an integer: use e.g. {key}={cfg.defaults.get(key) or 1}")
    if key in cfg.float_keys | cfg.fraction_keys:
        if key == "fraction" and isinstance(value, list):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"'{key}={value}' is not a number: use e.g. {key}={cfg.defaults.get(key)}")
        if key in cfg.fraction_keys and key != "fraction" and not 0.0 <= value <= 1.0:
            raise UsageError(f"'{key}={value}' is out of range: valid values are between 0.0 and 1.0")
    if key == "imgsz":
        ok = (isinstance(value, int) and not isinstance(value, bool) and value > 0) or (
            isinstance(value, (list, tuple)) and all(isinstance(v, int) and v > 0 for v in value)
        )
        if not ok:
            raise UsageError(f"'imgsz={value}' is not an image size: use e.g. imgsz=640")
    if key == "batch" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UsageError(f"'batch={value}' is not a batch size: use e.g. batch=16, or batch=-1 for AutoBatch")
    if key == "epochs" and value < 1:
        raise UsageError(f"'epochs={value}' must be at least 1")
    return value
