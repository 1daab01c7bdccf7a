"""Finding, verifying and keeping good checkpoints, without importing torch.

Ultralytics writes ``last.pt`` with a plain ``write_bytes``: a kill in the middle leaves it
truncated. A torch checkpoint is a zip archive whose central directory sits at the end and
whose members carry CRCs, so :func:`verify` can tell a complete file from a truncated or
damaged one by reading it once, with the standard library. After every save the training
child keeps a verified copy, ``last_good.pt``, written atomically; resume falls back to it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from rocm_yolo.errors import UsageError
from rocm_yolo.fsutil import copy_atomic
from rocm_yolo.paths import GOOD_NAME


def verify(path: str | os.PathLike) -> str | None:
    """``None`` when ``path`` is a complete torch checkpoint, else the reason it is not."""
    p = Path(path)
    if not p.is_file():
        return "no such file"
    if p.stat().st_size == 0:
        return "empty file"
    try:
        with zipfile.ZipFile(p) as z:
            names = z.namelist()
            if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
                return "not a torch checkpoint (no data.pkl)"
            bad = z.testzip()
            if bad is not None:
                return f"damaged member {bad}"
    except zipfile.BadZipFile:
        return "truncated or not a torch checkpoint"
    except (OSError, EOFError) as e:
        return f"unreadable ({e.__class__.__name__}: {e})"
    return None


def keep_good_copy(last: str | os.PathLike) -> Path | None:
    """Verify ``last`` and copy it atomically to ``last_good.pt`` beside it; return the copy."""
    last = Path(last)
    if verify(last) is not None:
        return None
    good = last.with_name(GOOD_NAME)
    copy_atomic(last, good, durable=True)
    return good


def find_latest(project: str | os.PathLike) -> Path | None:
    """The newest ``weights/last.pt`` under ``project`` (by modification time)."""
    root = Path(project)
    if not root.is_dir():
        return None
    found = [p for p in root.glob("**/weights/last.pt") if p.is_file()]
    found += [
        p.with_name("last.pt")
        for p in root.glob(f"**/weights/{GOOD_NAME}")
        if p.is_file() and not p.with_name("last.pt").exists()
    ]
    return max(found, key=lambda p: (p if p.exists() else p.with_name(GOOD_NAME)).stat().st_mtime, default=None)


def choose_resume(last: str | os.PathLike) -> tuple[Path, str | None]:
    """The checkpoint to resume from for ``last`` and a note when it is not ``last`` itself.

    A truncated ``last.pt`` is moved aside (never deleted) and the verified copy is used.
    Raises :class:`UsageError` when neither is usable.
    """
    last = Path(last)
    reason = verify(last)
    if reason is None:
        return last, None
    good = last.with_name(GOOD_NAME)
    if verify(good) is None:
        note = f"{last} is unusable ({reason}); resuming from the verified copy {good}"
        if last.exists():
            aside = last.with_name(last.stem + ".truncated.pt")
            os.replace(last, aside)
            note += f" (the damaged file was kept as {aside.name})"
        return good, note
    if reason == "no such file":
        raise UsageError(f"checkpoint not found: {last}")
    raise UsageError(f"checkpoint {last} is unusable ({reason}) and no verified copy exists: start a new run")
