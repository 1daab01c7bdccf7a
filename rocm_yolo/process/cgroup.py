"""The memory cgroup a run lives in: how many of its processes the OOM killers killed, and how much memory it allows.

The kernel counts, in each memory cgroup, the processes of it (and of the cgroups below it) killed by any OOM
killer, its own or the machine's (mm/oom_kill.c: ``memcg_memory_event_mm(mm, MEMCG_OOM_KILL)``), and says so
readably from inside a container or a SLURM job where the kernel log is not:

- cgroup v2 (Documentation/admin-guide/cgroup-v2.rst): ``memory.events``' ``oom_kill``, the limit in
  ``memory.max`` (``max``: none), the tightest on the way up to the root counting;
- cgroup v1 (Documentation/admin-guide/cgroup-v1/memory.rst): ``memory.oom_control``' ``oom_kill`` (Linux 4.13 and
  later), the limit in ``memory.stat``'s ``hierarchical_memory_limit`` (else ``memory.limit_in_bytes``).

The run's cgroup is the supervisor's (its children inherit it), named in ``/proc/self/cgroup``; the files are under
``/sys/fs/cgroup`` (v2 also under ``unified/`` beside v1's ``memory/`` on a hybrid system). Both roots may be moved
(tests: fake trees, ``WatchdogConfig.cgroup_root`` and ``proc_root``).
:func:`read` never raises: what cannot be read is said (:attr:`CgroupMemory.why`), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rocm_yolo.process.kernel_view import PROC

CGROUP = "/sys/fs/cgroup"
UNLIMITED = 1 << 62  # v1 writes PAGE_COUNTER_MAX pages (9223372036854771712) for no limit


@dataclass(frozen=True)
class CgroupMemory:
    """One reading of the run's memory cgroup."""

    path: str = ""  # the cgroup's folder, where it was read
    oom_kills: int | None = None  # the OOM kills it counted so far; None: not readable
    limit: int | None = None  # bytes it (or a cgroup above it) allows; None: no limit, or not readable
    limit_at: str = ""  # the file that sets the limit
    why: str = ""  # not readable: why
    version: int = 0  # 2 or 1; 0: none found

    @property
    def source(self) -> str:
        """Where the reading came from, or why there is none."""
        counted = "memory.events" if self.version == 2 else "memory.oom_control"
        return self.why or f"cgroup v{self.version} {self.path} ({counted})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _mine(proc_root: str | None) -> tuple[str | None, str | None, str]:
    """(the v2 path, the v1 memory path, why neither) from ``/proc/self/cgroup``."""
    text = _read(Path(proc_root or PROC) / "self" / "cgroup")
    if text is None:
        return None, None, f"cgroup not readable ({Path(proc_root or PROC) / 'self' / 'cgroup'} unreadable)"
    v2 = v1 = None
    for line in text.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1, "" if v2 is not None or v1 is not None else "cgroup not readable (no memory cgroup named)"


def _folder(base: Path, path: str) -> Path:
    """The cgroup's folder: under the mount, or the mount itself (a container sees its own cgroup as the root)."""
    inside = base / path.lstrip("/")
    return inside if inside.is_dir() else base


def _limit_v2(folder: Path, base: Path) -> tuple[int | None, str]:
    """The tightest ``memory.max`` from ``folder`` up to the mount."""
    best: tuple[int | None, str] = (None, "")
    here = folder
    while True:
        value = (_read(here / "memory.max") or "").strip()
        if value.isdigit() and (best[0] is None or int(value) < best[0]):
            best = (int(value), str(here / "memory.max"))
        if here == base or base not in here.parents:
            return best
        here = here.parent


def read(proc_root: str | None = None, cgroup_root: str | None = None) -> CgroupMemory:
    """The run's memory cgroup now: its OOM kills and its limit (v2, else v1)."""
    v2, v1, why = _mine(proc_root)
    base = Path(cgroup_root or CGROUP)
    for mount in (base, base / "unified") if v2 is not None else ():  # unified: v2 beside v1 (a hybrid system)
        folder = _folder(mount, v2)
        events = _read(folder / "memory.events")
        if events is not None:
            limit, at = _limit_v2(folder, mount)
            return CgroupMemory(str(folder), _keyed(events, "oom_kill"), limit, at, version=2)
        why = f"cgroup not readable (no {folder / 'memory.events'}: the memory controller is not enabled there)"
    if v1 is not None:
        for mount in (base / "memory", base):
            folder = _folder(mount, v1)
            control = _read(folder / "memory.oom_control")
            if control is None:
                continue
            kills = _keyed(control, "oom_kill")
            limit = _keyed(_read(folder / "memory.stat"), "hierarchical_memory_limit")
            at = str(folder / "memory.stat")
            if limit is None:
                value = (_read(folder / "memory.limit_in_bytes") or "").strip()
                limit, at = (int(value) if value.isdigit() else None), str(folder / "memory.limit_in_bytes")
            limit = None if limit is None or limit >= UNLIMITED else limit
            why = "" if kills is not None else f"cgroup not readable (no oom_kill in {folder / 'memory.oom_control'})"
            return CgroupMemory(str(folder), kills, limit, at if limit is not None else "", why, version=1)
        why = why or f"cgroup not readable (no memory.oom_control under {base})"
    return CgroupMemory(why=why or f"cgroup not readable (under {base})")
