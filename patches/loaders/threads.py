"""Loading in threads of the trainer process (the ``threads`` profile): no fork, no spawn.

A DataLoader worker process gives the fallback ladder nothing to fear from the GPU runtime
only if it is not a process at all; the ``single`` profile achieves that by loading in the
main thread, at a quarter of the speed. Here the loading runs in N threads inside the
trainer instead: OpenCV and NumPy release the GIL for decoding, resizing and warping, so the
threads load in parallel (measured 68 images/s sequential, 315 with 4-8 threads, 16 cores).

The design copies what torch does with worker processes, only with threads:

- **one copy of the dataset per thread**, made when the iterator starts (as a worker gets
  its copy when it starts): Ultralytics' ``load_image`` mutates per-sample state (the mosaic
  ``buffer`` list, the ``ims``/``im_hw0``/``im_hw`` lists), which threads must not share.
  :func:`thread_copy` gives each thread its own lists and dicts (shallow: the images and
  labels in them are shared, never mutated in place by Ultralytics' loaders) and its own
  deep copy of ``transforms``, whose mix transforms (Mosaic, MixUp, CutMix, CopyPaste) hold
  the dataset and now hold the copy. Everything else (labels, a ``cache='ram'`` image cache,
  file lists) is shared.
- **its own random generators**: :mod:`rocm_yolo.patches.loaders.thread_rng` makes the module-level
  ``random.*`` and ``np.random.*`` functions that Ultralytics' augmentations call dispatch to
  the calling thread's generators, seeded exactly as torch and Ultralytics seed worker
  ``i``: from the base seed torch draws from the loader's ``generator``, plus ``i``. So
  ``seed=`` with ``deterministic=True`` gives the same batches run after run, and the same
  batches as process workers would, whatever the thread scheduling. (torch's own global
  generator cannot be given per thread: transforms that draw from it, torchvision's in
  classification training, are not reproducible under this profile.)
- **batches assigned round-robin** (batch ``k`` to thread ``k % N``, as torch assigns them
  to workers), ``prefetch`` batches in flight per thread, results yielded in order;
- torch's **timeout** (a stuck thread raises "DataLoader timed out after N seconds"),
  **pin_memory** (pinned in the loader thread, on the trainer's device, as torch's pin
  thread does), exceptions re-raised in the trainer with the thread's traceback, and
  ``torch.set_num_threads(1)`` per thread (thread-local; as in a worker) so collating does
  not start an OpenMP team per thread.

The iterator keeps torch's interface where Ultralytics touches it: ``_workers`` (objects
with ``is_alive()``, ``terminate()`` and ``pid`` = None) and ``_shutdown_workers()``, so
``InfiniteDataLoader.close()``/``reset()``/``__del__`` stop the threads unchanged. A loader's
``worker_init_fn`` is not called: it is written for a process (Ultralytics' ``seed_worker``
reseeds from ``torch.initial_seed()``, which all threads share); its effect is reproduced by
the seeding above. ``get_worker_info()`` stays None, as in the main process.

The patch is one class attribute, ``DataLoader._get_iterator``: loaders the DataLoader
patch marked with :func:`attach` (the run's own, ``num_workers=0`` under a ``threads`` setting) get a
:class:`ThreadedLoaderIter`; every other loader gets torch's own iterator. :func:`install`
is idempotent; :func:`uninstall` puts the original function object back.
"""

from __future__ import annotations

import atexit
import copy
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils.data

from rocm_yolo.patches.loaders import thread_rng
from rocm_yolo.patches.swap import Swaps
from rocm_yolo.run import hooks
from rocm_yolo.ultralytics_rules import compat

try:  # torch internals (REQUIREMENTS below): without them the marked loaders load in the main thread
    from torch._utils import ExceptionWrapper
    from torch.utils.data._utils.pin_memory import pin_memory as _pin
    from torch.utils.data._utils.worker import _generate_state
    from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind
except ImportError:  # pragma: no cover - depends on the torch version
    _BaseDataLoaderIter = None

ATTRIBUTE = "_rocm_yolo_threads"  # a marked loader's ThreadPlan
JOIN_SECONDS = 5.0  # close() waits at most this long in all for threads to finish their current batch
JOIN_AT_EXIT_SECONDS = 10.0  # the interpreter's exit waits at most this long for busy loader threads
POLL_SECONDS = 5.0  # while waiting for a batch with no timeout: how often to check the thread is alive
OS_NAME_PREFIX = "loader-"  # loader threads' OS names: loader-train-0, loader-val-1, ...
TRANSFORM_ATTRIBUTES = ("transforms",)  # deep-copied per thread: Ultralytics' mix transforms hold the dataset

_swaps = Swaps()  # DataLoader._get_iterator
_live: set = set()  # loader threads that have not finished
_exit_hook = False


@dataclass(frozen=True)
class ThreadPlan:
    """How a marked loader loads: ``threads`` threads, ``prefetch`` batches in flight each."""

    threads: int
    prefetch: int
    timeout: float
    role: str = "other"
    run_dir: str | None = None  # the run whose worker-hang fault trigger the threads watch


def available() -> bool:
    return _BaseDataLoaderIter is not None


def _patchable() -> bool:
    return available() and "_get_iterator" in torch.utils.data.DataLoader.__dict__ and thread_rng.patchable()


# torch internals this patch relies on (checked at start-up with Ultralytics' own, rocm_yolo.ultralytics_rules.compat)
REQUIREMENTS = (
    compat.Requirement(
        "DataLoader._get_iterator, _BaseDataLoaderIter, _DatasetKind, ExceptionWrapper, _generate_state; "
        "random._inst and numpy.random.mtrand._rand",
        "loader threads (profile threads: its loaders load in the main thread instead)",
        False,
        _patchable,
        owner="torch",
    ),
)


def installed() -> bool:
    return _swaps.installed()


def install() -> None:
    """Route marked loaders to :class:`ThreadedLoaderIter` and install the per-thread generators (idempotent)."""
    global _exit_hook
    thread_rng.install()
    if not _exit_hook:
        atexit.register(_stop_all_at_exit)
        _exit_hook = True
    if available():
        _swaps.replace(torch.utils.data.DataLoader, "_get_iterator", _routing)


def _routing(original):
    def _get_iterator(self):
        plan = getattr(self, ATTRIBUTE, None)
        if plan is None or self.num_workers != 0 or self._dataset_kind != _DatasetKind.Map:
            return original(self)
        return ThreadedLoaderIter(self, plan)

    _get_iterator.__wrapped__ = original
    return _get_iterator


def uninstall() -> None:
    """Restore ``DataLoader._get_iterator`` and the global generators exactly; a no-op when not installed."""
    _swaps.restore()
    thread_rng.uninstall()


def attach(
    loader,
    threads: int,
    prefetch: int | None,
    timeout: float,
    role: str | None = None,
    run_dir: str | os.PathLike | None = None,
) -> ThreadPlan | None:
    """Mark ``loader`` (built with ``num_workers=0``) to load in up to ``threads`` threads.

    No more threads than batches in one pass (as Ultralytics caps its workers); a loader with
    one batch, or an iterable-style dataset, stays in the main thread. Returns the plan, or
    None when the loader stays unmarked (it then loads in the main thread, as under ``single``).
    """
    try:  # torch's own count: Ultralytics' InfiniteDataLoader.__len__ is not right before its __init__ ends
        batches = torch.utils.data.DataLoader.__len__(loader)
    except TypeError:  # no length (e.g. an iterable-style dataset)
        batches = threads
    n = min(threads, batches)
    if batches <= 1 or n < 1 or loader.num_workers != 0 or isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None
    plan = ThreadPlan(
        threads=n,
        prefetch=max(1, prefetch or 2),
        timeout=float(timeout or 0),
        role=role or "other",
        run_dir=None if run_dir is None else str(run_dir),
    )
    setattr(loader, ATTRIBUTE, plan)
    return plan


def _stop_all_at_exit() -> None:
    """Stop the loader threads before the interpreter finalizes (an atexit hook).

    CPython 3.11 ends a daemon thread that wakes up during finalization with
    ``pthread_exit``, whose forced unwind through a C++ frame (a torch call that released
    the GIL) aborts the whole process ("terminate called without an active exception":
    seen with spawn workers whose queue thread was still sending a batch). So every loader
    thread still busy is asked to stop and given up to JOIN_AT_EXIT_SECONDS to finish its
    batch; one stuck for good sleeps in a lock wait, which is safe to leave.
    """
    stop_and_join(list(_live), JOIN_AT_EXIT_SECONDS)


def stop_and_join(threads: list, cap: float) -> None:
    """Ask ``threads`` to stop after their current batch and wait for that, ``cap`` seconds at most.

    A thread cannot be killed. One whose current batch has run more than twice its slowest
    batch so far, plus half a second, is stuck (a hang the watchdog deals with): it is not
    waited for, and stays behind as a daemon thread, so that neither ``close()`` nor the exit
    the watchdog asked for is held up by it.
    """
    for t in threads:
        t.terminate()
    now = time.monotonic()
    deadline = now + cap
    for t in threads:
        busy_since, slowest = t.busy_since, t.slowest
        if busy_since is None:  # idle: it leaves at once
            until = deadline
        elif slowest:
            until = min(deadline, busy_since + 2 * slowest + 0.5)
        else:  # its first batch: no measure of what is normal yet
            until = deadline
        t.join(timeout=max(0.0, until - time.monotonic()))


# --------------------------------------------------------------------------- per-thread state


def thread_copy(dataset: Any) -> Any:
    """A copy of ``dataset`` for one loader thread: own per-sample state, shared data.

    Lists, dicts and sets become the thread's own (shallow) copies: Ultralytics mutates the
    mosaic ``buffer`` and the ``ims``/``im_hw0``/``im_hw`` lists per sample. ``transforms`` is
    deep-copied, with every reference to the dataset (or to one of its attributes) pointing
    at the copy's; everything else is shared. A dataset without ``__dict__`` is shared as is.
    """
    if isinstance(dataset, torch.utils.data.ConcatDataset):
        twin = copy.copy(dataset)
        twin.datasets = [thread_copy(d) for d in dataset.datasets]
        return twin
    try:
        state = vars(dataset)
    except TypeError:
        return dataset
    twin = copy.copy(dataset)
    own = vars(twin)
    memo: dict[int, Any] = {id(dataset): twin}
    for name, value in state.items():
        if type(value) in (list, dict, set):
            own[name] = type(value)(value)
        memo[id(value)] = own[name]
    for name in TRANSFORM_ATTRIBUTES:
        if name in state:
            del memo[id(state[name])]
            try:
                own[name] = copy.deepcopy(state[name], memo)
            except Exception as e:  # noqa: BLE001 - e.g. a third-party transform that cannot be copied
                raise RuntimeError(
                    f"loader threads: cannot copy the dataset's {name} for a thread "
                    f"({type(e).__name__}: {e}); use --profile single"
                ) from e
    return twin


def worker_seeds(base_seed: int, worker_id: int, worker_init_fn: Callable | None) -> tuple[int, Any]:
    """The seeds of ``random`` and ``numpy.random`` that DataLoader worker ``worker_id`` ends up with.

    torch seeds ``random`` with ``base_seed + worker_id`` and NumPy with a hash of both;
    Ultralytics' ``seed_worker`` (its loaders' ``worker_init_fn``) then reseeds both with
    ``torch.initial_seed() % 2**32``, which in the worker is ``base_seed + worker_id``.
    """
    if (
        getattr(worker_init_fn, "__module__", None) == "ultralytics.data.build"
        and getattr(worker_init_fn, "__qualname__", None) == "seed_worker"
    ):
        seed = (base_seed + worker_id) % 2**32
        return seed, seed
    return base_seed + worker_id, _generate_state(base_seed, worker_id)


# --------------------------------------------------------------------------- threads


class LoaderThread(threading.Thread):
    """One loader thread: fetches the batches it is given, in order, from its own dataset copy."""

    pid = None  # not a process: there is nothing to signal or kill (Ultralytics and the events log read .pid)

    def __init__(
        self,
        worker_id: int,
        dataset: Any,
        fetch_args: tuple,
        seeds: tuple,
        pin: bool,
        device_type: str | None,
        device_index: int | None,
        hang: Callable[[], None] | None,
        role: str,
    ):
        super().__init__(name=f"rocm-yolo-{role}-loader-{worker_id}", daemon=True)
        self.worker_id, self.role = worker_id, role
        self.dataset = dataset
        self.fetch_args = fetch_args
        self.seeds = seeds
        self.pin, self.device_type, self.device_index = pin, device_type, device_index
        self.hang = hang
        self.index_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.data_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.slowest = 0.0  # seconds of the slowest batch so far (0: none done yet)
        self.busy_since: float | None = None  # monotonic start of the batch in progress (None: idle)

    def start(self) -> None:
        _live.add(self)
        super().start()

    def run(self) -> None:
        set_name = getattr(torch.multiprocessing, "_set_thread_name", None)  # as torch names its pin thread
        if set_name is not None:  # the OS name (15 characters): what top -H, ps -L and /proc/PID/task show
            set_name(f"{OS_NAME_PREFIX}{self.role}-{self.worker_id}"[:15])
        torch.set_num_threads(1)  # thread-local, as in a worker process: collate must not start an OpenMP team
        thread_rng.bind(*self.seeds)
        try:
            if self.pin and self.device_index is not None:
                torch.accelerator.set_device_index(self.device_index)
            fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, self.dataset, *self.fetch_args)
            while not self.stopping.is_set():
                task = self.index_queue.get()
                if task is None or self.stopping.is_set():
                    break
                k, index = task
                started = self.busy_since = time.monotonic()
                try:
                    if self.hang is not None:
                        self.hang()
                    data = fetcher.fetch(index)
                    if self.pin:
                        data = _pin(data, self.device_type)
                except BaseException:  # noqa: BLE001 - re-raised in the trainer, with this thread's traceback
                    data = ExceptionWrapper(where=f"in DataLoader loader thread {self.worker_id}")
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.busy_since = None
                self.data_queue.put((k, data))
                del data
        finally:
            thread_rng.unbind()
            self.dataset = None
            _live.discard(self)

    def terminate(self) -> None:
        """Stop after the current batch (what ``InfiniteDataLoader.__del__`` calls on workers)."""
        self.stopping.set()
        self.index_queue.put(None)


class ThreadedLoaderIter(_BaseDataLoaderIter if _BaseDataLoaderIter is not None else object):
    """A DataLoader iterator whose workers are threads of this process (see the module docstring)."""

    def __init__(self, loader, plan: ThreadPlan):
        super().__init__(loader)  # index sampler, collate, pin memory, and the base seed from loader.generator

        self._timeout = plan.timeout  # the loader itself keeps timeout=0: torch's own iterator rejects others
        self._prefetch = plan.prefetch
        self._shutdown = False
        self._sent = self._rcvd = 0
        self._exhausted = False
        device_index = torch.accelerator.current_device_index() if self._pin_memory else None
        fetch_args = (self._auto_collation, self._collate_fn, self._drop_last)
        hang = hooks.worker_hang_check(plan.run_dir)  # tests only: ROCM_YOLO_FAULT=worker-hang
        self._workers = [
            LoaderThread(
                i,
                thread_copy(self._dataset),
                fetch_args,
                worker_seeds(self._base_seed, i, loader.worker_init_fn),
                self._pin_memory,
                self._pin_memory_device,
                device_index,
                hang,
                plan.role,
            )
            for i in range(plan.threads)
        ]
        for w in self._workers:
            w.start()
        for _ in range(self._prefetch * len(self._workers)):
            self._try_put_index()

    def _try_put_index(self) -> None:
        if self._exhausted or self._shutdown:
            return
        try:
            index = self._next_index()
        except StopIteration:
            self._exhausted = True
            return
        self._workers[self._sent % len(self._workers)].index_queue.put((self._sent, index))
        self._sent += 1

    def _get(self, worker: LoaderThread):
        if self._timeout > 0:
            try:
                return worker.data_queue.get(timeout=self._timeout)
            except queue.Empty:
                raise RuntimeError(f"DataLoader timed out after {self._timeout:g} seconds") from None
        while True:  # wait forever (the watchdog watches), but notice a thread that is gone
            try:
                return worker.data_queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not worker.is_alive():
                    raise RuntimeError(f"DataLoader loader thread {worker.worker_id} exited unexpectedly") from None

    def _next_data(self):
        if self._shutdown or self._rcvd == self._sent:  # every batch handed out: the sampler is exhausted
            self._shutdown_workers()
            raise StopIteration
        k, data = self._get(self._workers[self._rcvd % len(self._workers)])
        assert k == self._rcvd, f"loader thread returned batch {k}, expected {self._rcvd}"
        self._rcvd += 1
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _shutdown_workers(self) -> None:
        """Stop every thread after its current batch (see :func:`stop_and_join`); torch's name."""
        if self._shutdown:
            return
        self._shutdown = True
        stop_and_join(self._workers, JOIN_SECONDS)

    def __del__(self):
        if getattr(self, "_workers", None):
            self._shutdown_workers()
