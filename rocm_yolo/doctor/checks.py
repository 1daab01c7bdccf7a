"""The doctor's checks, one registry: each check's names, its place in the order, and its function.

The runner (:func:`run_all`) and ``--skip`` both read :data:`CHECKS`: to add a check, write its
function (``(opts, facts) -> rows``) in the module of its concern and add one :class:`Check` here,
where it should run. A check that also serves a second name (the data check runs the loader
probe on the data it has just checked) lists it in ``names``, and runs unless all its names are
skipped. What several checks share (the GPUs found, torch's build and whether it imports) is
found once per run, when a check first asks (:class:`Facts`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from rocm_yolo.doctor.options import Options
from rocm_yolo.doctor.report import SKIP, Row


class Facts:
    """What the checks share, found lazily and once: the GPUs of the KFD topology, torch's build and its import."""

    def __init__(self, opts: Options):
        self.opts = opts

    @functools.cached_property
    def gpus(self) -> tuple:
        """``(gpus, why none)`` as :func:`rocm_yolo.doctor.gpu_checks.detect_gpus` finds them."""
        from rocm_yolo.doctor import gpu_checks

        return gpu_checks.detect_gpus(self.opts)

    @functools.cached_property
    def build(self) -> dict:
        from rocm_yolo.gpu.torch_build import torch_build

        return torch_build()

    @functools.cached_property
    def kind(self) -> str:
        from rocm_yolo.doctor import system

        return system.torch_kind(self.build)

    @functools.cached_property
    def torch_error(self) -> str | None:
        """Why torch cannot be imported (a bounded subprocess tries), or None."""
        from rocm_yolo.doctor import system

        if not self.build.get("path"):
            return "torch is not installed"
        return system.torch_import_error(self.opts)


def _versions(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import system

    gpus, _ = facts.gpus
    return system.check_versions(opts, gpus, facts.torch_error if facts.build.get("path") else None)


def _gpu(opts: Options, facts: Facts) -> Iterator[Row]:
    from rocm_yolo.doctor import gpu_checks

    gpus, why = facts.gpus
    yield from gpu_checks.check_gpu(opts, gpus, why)
    yield from gpu_checks.check_torch_gpu(opts, gpus, facts.kind)


def _shm(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import system

    return system.check_shm(opts)


def _start(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import system

    return system.check_start_method(opts)


def _data_and_loader(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import data_checks

    if opts.data is not None:
        torch_error = facts.torch_error if "loader" not in opts.skip else None
        return data_checks.check_data_and_loader(opts, torch_error)
    if "data" in opts.skip:
        return []
    return [Row("data.yaml", "data set", SKIP, "no DATA given: pass a data YAML (or 'demo') to check data and loading")]


def _conv(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import gpu_checks

    gpus, _ = facts.gpus
    return gpu_checks.check_conv(opts, gpus, facts.kind)


def _kernel(opts: Options, facts: Facts) -> Iterable[Row]:
    from rocm_yolo.doctor import system

    return system.check_kernel_log(opts)


@dataclass(frozen=True)
class Check:
    names: tuple[str, ...]  # what --skip takes; the first is the check's own, the others what it also serves
    run: Callable[[Options, Facts], Iterable[Row]]


CHECKS = (
    Check(("versions",), _versions),
    Check(("gpu",), _gpu),
    Check(("shm",), _shm),
    Check(("start",), _start),
    Check(("data", "loader"), _data_and_loader),  # the loader probe runs on the data just checked
    Check(("conv",), _conv),
    Check(("kernel",), _kernel),
)
NAMES = tuple(name for check in CHECKS for name in check.names)  # in the order they run


def run_all(opts: Options) -> Iterator[Row]:
    """Every check not in ``opts.skip``, in order."""
    facts = Facts(opts)
    for check in CHECKS:
        if not set(check.names) <= opts.skip:
            yield from check.run(opts, facts)
