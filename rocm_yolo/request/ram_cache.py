"""``cache=ram`` with DataLoader workers: shared through ``/dev/shm``, loaded in threads, or refused; never a copy
per worker.

rocm-yolo's workers come from a fork server, so each gets the dataset pickled; Ultralytics' cache then
goes through ``/dev/shm`` when it has twice the cache free, and is copied into every worker when it
has not (:mod:`rocm_yolo.ultralytics_rules.data.cache`). Before anything starts, this counts the
cache in the shared memory a run needs and chooses what works: the workers share it (a line in the
run header says how much), or, when ``/dev/shm`` cannot hold it twice, the ``threads`` profile (its
loader threads share the trainer's memory) when the user chose no profile, else a refusal that says
what to give: Docker's ``--shm-size`` or ``--ipc=host``, ``cache=disk``, or ``--profile threads``.
"""

from __future__ import annotations

from rocm_yolo.errors import UsageError, option
from rocm_yolo.run.spec import LoaderSettings
from rocm_yolo.ultralytics_rules.data import cache as ucache
from rocm_yolo.ultralytics_rules.tasks import CLASSIFY

SHARES = "forkserver", "spawn"  # start methods that pickle the dataset into each worker (fork shares it)


def wants_ram(train_args: dict) -> bool:
    return train_args.get("cache") in (True, "ram", "True", "true")


def plan(data: str, task: str, imgsz: int, loader: LoaderSettings, profile_given: bool) -> tuple[str | None, str]:
    """For a run with ``cache=ram``: (the profile to run on instead, or None to keep it; a line for the header).

    Raises :class:`UsageError` when the workers would each get a copy and the user chose the profile."""
    if not loader.workers or loader.start_method not in SHARES:
        return None, ""  # no worker process, or fork (copy-on-write): nothing is pickled
    images = ucache.split_images(data, task)
    if not any(images):
        return None, ""
    found = ucache.estimate(images, imgsz)
    shm = ucache.shared_memory()
    shared = task != CLASSIFY and ucache.shares_ram_cache()
    if shared and shm is not None and shm[1] >= 2 * found.bytes:
        return None, (
            f"cache=ram: about {found.describe()}, shared with the DataLoader workers through /dev/shm "
            f"({shm[1] / 2**30:.1f} GiB free, twice the cache needed)"
        )
    why = f"cache=ram holds about {found.describe()}; the DataLoader workers would each get a copy of it" + (
        f" (/dev/shm has {shm[1] / 2**30:.1f} GiB free, it needs twice the cache)" if shared and shm else ""
    )
    if profile_given:
        raise UsageError(
            f"{why}: give /dev/shm more (Docker: --shm-size={max(1, round(2.5 * found.bytes / 2**30))}g or "
            f"--ipc=host), or use cache=disk, or {option('profile', 'threads')} (its loader threads share the cache)"
        )
    return "threads", f"{why}: loading in threads of the trainer instead (profile threads), which share it"
