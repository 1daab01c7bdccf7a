"""The training child's steps 2 and 3: environment and presets, the fork server, checked imports, the patches.

``prepare_environment`` must not import torch: it runs first, and torch, the fork server and
its workers inherit the environment it leaves. The fork server is started once torch and
Ultralytics are imported, before any patch is installed and before the GPU is touched.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from dataclasses import dataclass, field, replace

from rocm_yolo import errors
from rocm_yolo.errors import SetupError
from rocm_yolo.gpu import arch as gpu_arch
from rocm_yolo.gpu import presets as gpu_presets
from rocm_yolo.process.output import RunLog
from rocm_yolo.run.atomic import check_cache
from rocm_yolo.run.spec import LoaderSettings, RunSpec


@dataclass
class Environment:
    arch: str | None
    presets: list = field(default_factory=list)
    loader: LoaderSettings | None = None
    args: dict = field(default_factory=dict)  # train-argument presets (e.g. amp=False on gfx1010)
    conv: str = "native"  # requested conv strategy after presets ("auto" resolved later)
    conv_line: str = ""  # how the strategy was chosen, for the run header


def prepare_environment(spec: RunSpec, environ=os.environ) -> Environment:
    """Apply the profile's variables and the architecture's presets where the user set nothing."""
    for key, value in spec.env.items():
        environ.setdefault(key, value)
    arch = gpu_arch.detect_arch()
    user_args = {k: spec.conv if k == "conv" else spec.train_args.get(k, True) for k in spec.user_keys}
    found = gpu_presets.presets(arch, user_args, environ)
    env = Environment(arch=arch, presets=found, loader=spec.loader, conv=spec.conv)
    for p in found:
        if p.user_set:
            continue
        if p.kind == "env":
            environ[p.key] = str(p.value)
            if p.key.startswith("MIOPEN_") and p.key.endswith(("_PATH", "_DIR")):
                check_cache(str(p.value), "MIOpen's kernel database and cache")  # kernels run on the GPU
                os.makedirs(str(p.value), exist_ok=True)
        elif p.kind == "tool" and p.key == "conv":
            env.conv = str(p.value)
        elif p.kind == "arg":
            env.args[p.key] = p.value
        elif p.kind == "loader" and p.key in LoaderSettings.__dataclass_fields__:
            env.loader = replace(env.loader, **{p.key: p.value})
    if env.loader.fork_server:
        # numpy's OpenBLAS starts a pool of a thread per core when torch imports numpy; the trainer's numpy needs
        # none (torch does its math), and a process with threads is not forked into the fork server.
        environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def import_checked(name: str, what: str):
    """Import ``name``; a failure of any kind is a broken environment, named as such."""
    try:
        return importlib.import_module(name)
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise SetupError(
            f"{name} cannot be imported ({errors.one_line(e)}): {what}; 'rocm-yolo doctor' shows more"
        ) from e


def install_conv(spec: RunSpec, env: Environment) -> None:
    """Resolve ``--conv`` (``auto`` runs the self-test on ROCm) and install it."""
    from rocm_yolo.conv import patch as conv_patch
    from rocm_yolo.conv import selftest

    device = "cpu" if str(spec.train_args.get("device")) == "cpu" else "cuda"
    amp = env.args.get("amp", spec.train_args.get("amp", True)) not in (False, "fp32")
    try:
        strategy, env.conv_line = selftest.resolve_strategy(env.conv, env.arch, device=device, amp=amp)
    except selftest.SelfTestError as e:  # a restart would find none either
        raise SetupError(f"no working Conv2d strategy: {e}") from e
    if strategy != "native":
        conv_patch.install(strategy)
    env.conv = strategy


def setup(spec: RunSpec, log: RunLog) -> Environment:
    """Steps 2-3: everything before the model is built; raises for errors (the child reports them)."""
    env = prepare_environment(spec)  # 2. profile variables and architecture presets (no torch yet)
    import_checked("torch", "reinstall torch (on an AMD GPU, the ROCm build)")  # 3.
    import_checked("ultralytics", "reinstall ultralytics")
    if env.loader.fork_server:
        from rocm_yolo.trainer.forkserver import server

        # before any patch is installed and before the GPU is touched: a fork of this process, where that is safe
        why = server.start(spec.run_dir)
        if why:
            log.event("forkserver_exec", why=why)  # a new interpreter instead, which imports torch again
    tempdir = multiprocessing.process.current_process()._config.get("tempdir")  # multiprocessing's pymp-*
    if tempdir:  # its own finalizer removes it at exit; after a SIGKILL the supervisor does (restart.remove_leftovers)
        log.event("mp_tempdir", path=tempdir)
    from rocm_yolo.conv import patch as conv_patch
    from rocm_yolo.patches.loaders import dataloader as loader_patch
    from rocm_yolo.patches.loaders import threads as threads_patch
    from rocm_yolo.ultralytics_rules import compat

    requirements = (
        compat.REQUIREMENTS + loader_patch.REQUIREMENTS + threads_patch.REQUIREMENTS + conv_patch.REQUIREMENTS
    )
    for warning in compat.check(requirements):  # essential internals missing: SetupError; others: a feature is off
        log.event("compat", warning, warning=warning)
    loader_patch.install(env.loader, spec.run_dir)
    if not compat.missing_for(compat.FINAL_SAVE_FEATURE):
        from rocm_yolo.patches.saves import final_save

        final_save.install(spec.run_dir)  # the end of training rewrites last.pt and best.pt atomically
    if not compat.missing_for(compat.EPOCH_SAVE_FEATURE):
        from rocm_yolo.patches.saves import epoch_save

        epoch_save.install()  # each epoch's save of last.pt, best.pt and epochN.pt, atomically
    install_conv(spec, env)
    return env


def header_lines(spec: RunSpec, env: Environment) -> list[str]:
    import torch
    import ultralytics

    from rocm_yolo.gpu.torch_build import torch_view
    from rocm_yolo.version import __version__

    view = torch_view()
    build = (
        f"HIP {torch.version.hip}"
        if torch.version.hip
        else f"CUDA {torch.version.cuda}"
        if torch.version.cuda
        else "CPU"
    )
    device = spec.train_args.get("device") or "auto"
    lines = [
        f"rocm-yolo {__version__} | profile {spec.profile} | start method {_start_method(env.loader)} "
        f"| device {device} | attempt {spec.attempt}",
        f"torch {torch.__version__} ({build} build) | ROCm {view.get('hip') or '-'} | "
        f"Ultralytics {ultralytics.__version__} | Python {sys.version.split()[0]}",
        f"loaders: {env.loader.describe()}",
        f"conv: {env.conv_line}",
    ]
    lines += gpu_presets.header_lines(env.arch, env.presets)
    advice = gpu_presets.override_advice(env.arch, os.environ)
    if advice:
        lines.append(advice)
    return lines


def _start_method(loader: LoaderSettings) -> str:
    if not loader.workers:
        return "- (no worker process)"
    return "forkserver (preloaded)" if loader.start_method == "forkserver" else loader.start_method
