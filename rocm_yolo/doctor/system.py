"""The doctor's checks of the machine: versions, shared memory and open files, the start method, the kernel log.

Each ``check_*`` function takes the :class:`~rocm_yolo.doctor.report.Options` and yields
:class:`~rocm_yolo.doctor.report.Row` objects. Anything that imports torch runs in a fresh
interpreter under a time limit (:func:`python_json`), so no check can hang the doctor or
leave a process behind.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
from pathlib import Path
from typing import Iterator

from rocm_yolo.doctor.options import Options, loader_plan
from rocm_yolo.doctor.report import FAIL, OK, SKIP, WARN, Row
from rocm_yolo.gpu import kernel_log, known_fixes, wheels
from rocm_yolo.gpu.arch import architectures
from rocm_yolo.gpu.torch_build import torch_build
from rocm_yolo.process.tree import Outcome, python, run_bounded
from rocm_yolo.ultralytics_rules.versions import SUPPORTED_ULTRALYTICS, TESTED_TORCH, untested, untested_torch

# ---------------------------------------------------------------------------------------
# bounded subprocesses


def python_json(opts: Options, code: str, timeout: float, env: dict | None = None) -> tuple[dict | None, Outcome]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last stdout line."""
    outcome = run_bounded(python("-c", code, executable=opts.python), timeout, env)
    for line in reversed(outcome.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), outcome
            except ValueError:
                break
    return None, outcome


# ---------------------------------------------------------------------------------------
# 1. versions


def _rocm_root(opts: Options) -> Path:
    if opts.rocm_path is not None:
        return opts.rocm_path
    return opts.path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def rocm_version(root: Path) -> str | None:
    for name in (".info/version", ".info/version-dev", ".info/version-utils"):
        try:
            text = (root / name).read_text().strip()
        except OSError:
            continue
        if text:
            return text.splitlines()[0]
    return None


def _metadata_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def torch_kind(build: dict) -> str:
    if build.get("hip"):
        return "hip"
    if build.get("cuda"):
        return "cuda"
    return "cpu" if build.get("torch") else "none"


TORCH_IMPORT_PROBE = "import json, torch; print(json.dumps({'torch': torch.__version__}))"


IMPORT_TIMED_OUT = "import torch did not finish"


def torch_import_error(opts: Options) -> str | None:
    """Why ``import torch`` fails in a fresh interpreter (its last error line), or None if it works."""
    result, outcome = python_json(opts, TORCH_IMPORT_PROBE, min(opts.timeout, 120))
    if result is not None:
        return None
    if outcome.timed_out:
        return f"{IMPORT_TIMED_OUT} in {outcome.seconds:.0f} s (--timeout {opts.timeout:g})"
    tail = outcome.tail(1)
    return (
        tail[0]
        if tail
        else (f"killed by {outcome.signal_name}" if outcome.signal_name else f"exit code {outcome.returncode}")
    )


def _torch_row(build: dict, kind: str, have_gpu: bool, archs: list, data: dict) -> Row:
    """The torch row of a torch that imports: its build, and whether it can use the AMD GPU and was tested."""
    label = {"hip": f"ROCm/HIP {build['hip']} build", "cuda": f"CUDA {build['cuda']} build", "cpu": "CPU-only build"}
    status, fix, found = OK, None, f"{build['torch']}, {label[kind]}"
    if have_gpu and kind != "hip":
        status = FAIL
        fix = "this torch cannot use the AMD GPU: " + wheels.choose(archs, env={}).advice()
    elif build["torch"] and untested_torch(build["torch"]):
        status, found = WARN, f"{found}, older than the torch versions tested ({TESTED_TORCH} and newer)"
        fix = (
            "nothing to do unless training fails inside torch; then a newer torch: "
            + wheels.choose(archs, env={}).advice()
        )
    return Row("versions.torch", "torch", status, found, fix, data=dict(data, tested=TESTED_TORCH))


def check_versions(opts: Options, gpus: list | None, torch_error: str | None = None) -> Iterator[Row]:
    yield Row("versions.python", "Python", OK, f"{sys.version.split()[0]} ({opts.python})")
    build = torch_build()
    kind = torch_kind(build)
    have_gpu = bool(gpus)
    archs = architectures(gpus)
    data = dict(build, kind=kind)
    if build.get("path") is None:
        yield Row(
            "versions.torch",
            "torch",
            FAIL,
            "not installed",
            wheels.choose(archs, env={}).advice(),
            data=data,
        )
    elif torch_error is not None and torch_error.startswith(IMPORT_TIMED_OUT):  # the time allowed, not torch
        yield Row(
            "versions.torch",
            "torch",
            WARN,
            f"{build['torch'] or 'torch'} at {build['path']}: {torch_error}",
            "give the doctor more time (--timeout 300): a first import after installing torch can take minutes; "
            "if it never finishes, something it loads hangs",
            data=dict(data, error=torch_error),
        )
    elif torch_error is not None:
        yield Row(
            "versions.torch",
            "torch",
            FAIL,
            f"{build['torch'] or 'torch'} at {build['path']} fails to import: {torch_error}",
            "fix what the error names (a missing library, a broken PYTHONPATH) or reinstall torch "
            "(add --force-reinstall): " + wheels.choose(archs, env={}).advice(),
            data=dict(
                data, error=torch_error, verdict="torch cannot be imported: fix that first, nothing else can be tested"
            ),
        )
    else:
        yield _torch_row(build, kind, have_gpu, archs, data)
    ultra = _metadata_version("ultralytics")
    if ultra:
        outside = untested(ultra)
        yield Row(
            "versions.ultralytics",
            "Ultralytics",
            WARN if outside else OK,
            f"{ultra}, outside the tested range {SUPPORTED_ULTRALYTICS}" if outside else ultra,
            f"pip install 'ultralytics{SUPPORTED_ULTRALYTICS}'" if outside else None,
            data={"version": ultra, "tested": SUPPORTED_ULTRALYTICS},
        )
    else:
        yield Row("versions.ultralytics", "Ultralytics", FAIL, "not installed", "pip install ultralytics")
    root = _rocm_root(opts)
    version = rocm_version(root)
    if version:
        yield Row("versions.rocm", "ROCm", OK, f"{version} at {root}", data={"version": version, "path": str(root)})
    elif kind == "hip":
        yield Row(
            "versions.rocm",
            "ROCm",
            SKIP,
            f"no system ROCm at {root} (the ROCm torch wheel brings its own runtime)",
            data={"path": str(root)},
        )
    else:
        yield Row("versions.rocm", "ROCm", SKIP, f"not found at {root}", data={"path": str(root)})


# ---------------------------------------------------------------------------------------
# 3. shared memory and open files


def shm_need(workers: int, val_workers: int, prefetch: int, batch: int, imgsz: int) -> int:
    """Bytes of shared memory the prefetched batches hold: uint8 3 x imgsz x imgsz per image.

    The training loader holds ``workers x prefetch`` batches, the validation loader (twice
    the batch, Ultralytics) ``val_workers x prefetch`` batches; both keep their workers alive.
    """
    image = 3 * imgsz * imgsz
    return prefetch * (workers * batch + val_workers * 2 * batch) * image


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def shm_row(total: int, free: int, need: int, plan: dict, how: str) -> Row:
    """The /dev/shm verdict for ``total``/``free`` bytes against the estimated ``need``."""
    data = {"need": need, "total": total, "free": free, **plan}
    if plan["workers"] == 0:
        return Row("shm.size", "shared memory", OK, "not used: workers=0 (loading in the main process)", data=data)
    if total < need:
        docker = " (Docker's default)" if total <= 64 * 2**20 else ""
        return Row(
            "shm.size",
            "shared memory",
            FAIL,
            f"/dev/shm is {_gib(total)}{docker}, {how} need ~{_gib(need)}",
            "Docker: run with --shm-size=8g or --ipc=host; otherwise: sudo mount -o remount,size=8G /dev/shm; "
            "or use fewer --workers / a smaller --batch",
            data=data,
        )
    if free < need:
        return Row(
            "shm.size",
            "shared memory",
            WARN,
            f"/dev/shm has {_gib(free)} free of {_gib(total)}, {how} need ~{_gib(need)}",
            "free /dev/shm (stale files of crashed runs: ls -la /dev/shm) or use fewer --workers",
            data=data,
        )
    return Row("shm.size", "shared memory", OK, f"/dev/shm {_gib(free)} free, need ~{_gib(need)} ({how})", data=data)


def ram_cache_row(opts: Options, plan: dict, free: int | None) -> Row | None:
    """``--cache ram`` with worker processes that get the dataset pickled: shared through /dev/shm (Ultralytics
    does it with twice the cache free there), or a copy in every worker, which the run avoids (threads, or a
    refusal with --profile); None when nothing is pickled or the data cannot be listed."""
    from rocm_yolo.doctor.data_checks import data_task
    from rocm_yolo.ultralytics_rules.data import cache as ucache
    from rocm_yolo.ultralytics_rules.tasks import CLASSIFY

    if opts.cache != "ram" or not plan["workers"] or plan["start_method"] == "fork" or opts.data is None:
        return None
    task = data_task(opts)
    images = ucache.split_images(str(opts.data), task)
    if not any(images):
        return None
    found = ucache.estimate(images, opts.imgsz)
    data = {"cache_bytes": found.bytes, "images": found.images, "free": free}
    shares = task != CLASSIFY and ucache.shares_ram_cache()
    if shares and free is not None and free >= 2 * found.bytes:
        return Row(
            "shm.cache",
            "cache=ram",
            OK,
            f"~{found.describe()}, shared with the DataLoader workers through /dev/shm ({_gib(free)} free, "
            "twice the cache needed)",
            data=data,
        )
    why = (
        f"/dev/shm has {_gib(free or 0)} free, Ultralytics shares the cache only with twice its size free"
        if shares
        else "this Ultralytics copies its cache into each worker process"
    )
    return Row(
        "shm.cache",
        "cache=ram",
        WARN,
        f"~{found.describe()}: {why}; each of {plan['workers']} workers would get a copy, so rocm-yolo loads in "
        "threads instead (profile threads), or refuses a run that names another --profile",
        f"Docker: --shm-size={max(1, round(2.5 * found.bytes / 2**30))}g or --ipc=host; or cache=disk; "
        "or --profile threads",
        data=data,
    )


def check_shm(opts: Options) -> Iterator[Row]:
    plan = loader_plan(opts)
    need = shm_need(plan["workers"], plan["val_workers"], plan["prefetch"], opts.batch, opts.imgsz)
    shm = opts.path("/dev/shm")
    how = (
        f"{plan['workers']} workers + {plan['val_workers']} val workers x prefetch {plan['prefetch']} x batch "
        f"{opts.batch} at {opts.imgsz} px"
    )
    try:
        st = os.statvfs(shm)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as e:
        total = free = None
        err = e
    cache = ram_cache_row(opts, plan, free)
    if cache is not None and cache.status == OK:  # the cache lives in /dev/shm too, and needs twice its size there
        need += 2 * cache.data["cache_bytes"]
        how += f" + cache=ram {_gib(cache.data['cache_bytes'])} x 2"
    if total is None:
        yield Row(
            "shm.size",
            "shared memory",
            FAIL,
            f"/dev/shm not usable ({err.strerror})",
            "DataLoader workers pass batches through /dev/shm: mount it (Docker: --shm-size=8g or --ipc=host)",
            data=dict(plan, need=need),
        )
    else:
        yield shm_row(total, free, need, plan, how)
    if cache is not None:
        yield cache
    soft, hard = opts.nofile or resource.getrlimit(resource.RLIMIT_NOFILE)
    data = {"soft": soft, "hard": hard}
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if plan["workers"] and soft != resource.RLIM_INFINITY and soft < 4096:
        yield Row(
            "shm.nofile",
            "open-file limit",
            WARN,
            f"{shown} (hard {hard}): workers share batches through file descriptors",
            "ulimit -n 65536 before training (Docker: --ulimit nofile=65536:65536)",
            data=data,
        )
    else:
        yield Row("shm.nofile", "open-file limit", OK, shown, data=data)


# ---------------------------------------------------------------------------------------
# 4. start method

START_PROBE = r"""
import json, multiprocessing as mp, os, sys
before = mp.get_start_method(allow_none=True)
hooks = {n: getattr(sys.modules.get(n), "__file__", None) for n in ("sitecustomize", "usercustomize")}
default = mp.get_context().get_start_method() if before is None else before
mp.set_start_method("spawn", force=True)
print(json.dumps({"before": before, "default": default, "after": mp.get_start_method(), "hooks": hooks,
                  "startup": os.environ.get("PYTHONSTARTUP")}))
"""
_SETS_FORK = re.compile(r"set_start_method\s*\(\s*['\"](fork|forkserver)['\"]|get_context\s*\(\s*['\"]fork['\"]")


def _mentions_fork(path: str | None) -> bool:
    try:
        return bool(path) and bool(_SETS_FORK.search(Path(path).read_text(errors="replace")))
    except OSError:
        return False


def check_start_method(opts: Options) -> Iterator[Row]:
    result, outcome = python_json(opts, START_PROBE, min(opts.timeout, 60))
    if result is None:
        yield Row(
            "start.method",
            "start method",
            WARN,
            "a fresh Python interpreter failed to report its start method",
            "run python -c 'import multiprocessing as m; print(m.get_start_method())' and look at the error",
            details=outcome.tail(),
        )
        return
    hooks = [p for p in result["hooks"].values() if p]
    culprits = [p for p in hooks if _mentions_fork(p)]
    data = dict(result, culprits=culprits)
    before = result["before"]
    if result["after"] != "spawn":
        yield Row(
            "start.method",
            "start method",
            FAIL,
            f"spawn could not be set (got {result['after']})",
            "report this as a bug",
            data=data,
        )
    elif before in ("fork", "forkserver"):
        where = ", ".join(culprits or hooks) or "an interpreter start-up hook"
        yield Row(
            "start.method",
            "start method",
            WARN,
            f"a fresh interpreter already has '{before}' set (by {where}); the training child still forces spawn",
            f"remove the set_start_method('{before}') call from {where}: your own scripts get {before}",
            data=data,
        )
    elif culprits:
        yield Row(
            "start.method",
            "start method",
            WARN,
            f"{', '.join(culprits)} mentions a fork start method",
            "check that start-up hook; the training child forces spawn",
            data=data,
        )
    else:
        yield Row(
            "start.method",
            "start method",
            OK,
            f"nothing forces one at start-up (default {result['default']}); the training child sets spawn "
            "and its workers fork from a preloaded server",
            data=data,
        )
    startup = result.get("startup")
    if startup and _mentions_fork(startup):
        yield Row(
            "start.startup",
            "PYTHONSTARTUP",
            WARN,
            f"{startup} sets a fork start method (interactive sessions only)",
            f"remove it from {startup}, or start notebooks and REPL training with spawn",
            data={"path": startup},
        )


# ---------------------------------------------------------------------------------------
# 8. kernel log


def check_kernel_log(opts: Options) -> Iterator[Row]:
    log = kernel_log.read(opts.kernel_log)
    source = log.source
    if not log.readable:
        yield Row(
            "kernel.log",
            "kernel log",
            SKIP,
            f"not readable ({source})",
            "look yourself: sudo dmesg | grep -i amdgpu",
            data={"source": source},
        )
        return
    counts, lines = kernel_log.scan(log.lines)
    data = {"source": source, "counts": counts, "lines": lines[-50:]}
    if not counts:
        yield Row("kernel.log", "kernel log", OK, f"no amdgpu hangs, resets or faults ({source})", data=data)
        return
    fixes = []
    if "userptr" in counts or "hogged CPU" in counts:
        fixes.append(
            "restore_userptr/hogged CPU is the sign of fork()ed DataLoader workers holding GPU memory: "
            "train through rocm-yolo (spawn workers), --profile safe if it persists"
        )
    if {"GPU reset", "ring timeout"} & set(counts):
        fixes.append("the GPU hung and was reset: check the HSA override row, try --profile safe or a smaller --batch")
    if "page fault" in counts:
        fixes.append("GPU page faults: usually code for the wrong arch (HSA override) or a driver bug")
    if "MES" in counts:
        fixes.append(f"the MES firmware stopped responding: {known_fixes.MES_FIX.text} ({known_fixes.MES_FIX.source})")
    if kernel_log.OOM in counts:
        named = ", ".join(f"{name} (pid {pid})" for pid, name in kernel_log.victims(lines)[-3:])
        fixes.append(f"the OOM killer killed {named or 'a process'}: fewer --workers, or cache=False")
    found = ", ".join(f"{n} x{c}" for n, c in counts.items()) + f" ({source})"
    details = [x[:160] for x in lines[-5:]]
    yield Row("kernel.log", "kernel log", WARN, found, "; ".join(fixes), details, data)
