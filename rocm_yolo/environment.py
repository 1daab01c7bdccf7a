"""Every environment variable rocm-yolo reads or sets, in one place (as submitit's ``JobEnvironment`` does it), but
a scheduler's own, which its backend names (:mod:`rocm_yolo.request.schedulers`).

The bottom of the house: it imports nothing of rocm-yolo's, and every other module takes the
names from here.

Between rocm-yolo's own processes (one sets it, a descendant reads it):

- :data:`SUPERVISOR_PID`: the supervisor, for the trainer and its workers (``PR_SET_PTRACER``: py-spy may attach);
- :data:`HEARTBEAT_FD`: the write end of the supervisor's heartbeat pipe, in the training child;
- :data:`HEARTBEAT_FIFO`: on several GPUs, the DDP launcher's FIFO each rank writes its heartbeat lines into;
- :data:`TORCHRUN_PID`: on several GPUs, the ``torch.distributed.run`` each rank dies with;
- :data:`TRAINER_PID`, :data:`RUN_DIR`: the trainer a fork server dies with, and where it records itself;
- :data:`FORKSERVER_IMPORTS`: the descriptor (a pipe from the trainer) of the modules the fork server imports
  before it forks (:mod:`rocm_yolo.trainer.forkserver.preimport`);
- :data:`NODE`: on more than one machine, rocm-yolo's id of this node: every process of its tree writes its
  files into the node's own folder of the run (:class:`rocm_yolo.run.paths.RunPaths`).

Set by users:

- :data:`CACHE_DIR`: rocm-yolo's cache (:func:`cache_dir`); :data:`DEMO_DIR`: the demo data set;
- :data:`KFD_ROOT`: the GPU topology (a fake tree in tests, a mounted system image);
- :data:`GEMM_CHUNK_MB`: the unfold buffer of the ``gemm`` Conv2d strategy;
- :data:`ONE_TRACKER_RUN`: ``0`` gives each attempt its own MLflow/W&B run, as plain Ultralytics does
  (by default the attempts of a run continue one tracker run).
- :data:`NOTIFY`: a command run for each event of a training run (``rocm-yolo train --notify``'s default).

For tests and benchmarks only:

- :data:`PLUGINS`: modules that answer the hook points of :mod:`rocm_yolo.run.hooks` (``rocm_yolo.testing``; any
  other module only with :data:`ANY_PLUGIN` set to 1, as the tests and the benchmarks set it);
- :data:`FAULT`, :data:`RECORD_BATCHES`: what that plugin reads (CONTRIBUTING.md, :mod:`rocm_yolo.testing`).

Torch's launcher sets :data:`RANK`, :data:`LOCAL_RANK`, :data:`WORLD_SIZE` and :data:`LOCAL_WORLD_SIZE` in each rank,
as Ultralytics reads them; rocm-yolo sets :data:`SHARE_RDZV_STORE_OFF` for it on more than one machine (pytorch#135712).

Read on more than one machine with no node flags (:mod:`rocm_yolo.request.cluster`): :data:`MASTER_ADDR` and
:data:`MASTER_PORT` when set (no port given: the run draws its own), else a scheduler's own variables, each named by
its backend (:mod:`rocm_yolo.request.schedulers`: SLURM's ``SLURM_NNODES``, ``SLURM_NODEID``, ...).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Mapping

# between rocm-yolo's processes
SUPERVISOR_PID = "ROCM_YOLO_SUPERVISOR_PID"
HEARTBEAT_FD = "ROCM_YOLO_HEARTBEAT_FD"
HEARTBEAT_FIFO = "ROCM_YOLO_HEARTBEAT_FIFO"
TORCHRUN_PID = "ROCM_YOLO_TORCHRUN_PID"
TRAINER_PID = "ROCM_YOLO_TRAINER_PID"
RUN_DIR = "ROCM_YOLO_RUN_DIR"
FORKSERVER_IMPORTS = "ROCM_YOLO_FORKSERVER_IMPORTS"
NODE = "ROCM_YOLO_NODE"

# set by users
CACHE_DIR = "ROCM_YOLO_CACHE_DIR"
DEMO_DIR = "ROCM_YOLO_DEMO_DIR"
KFD_ROOT = "ROCM_YOLO_KFD_ROOT"
GEMM_CHUNK_MB = "ROCM_YOLO_GEMM_CHUNK_MB"
ONE_TRACKER_RUN = "ROCM_YOLO_ONE_TRACKER_RUN"
NOTIFY = "ROCM_YOLO_NOTIFY"

# tests and benchmarks
PLUGINS = "ROCM_YOLO_PLUGINS"
ANY_PLUGIN = "ROCM_YOLO_TEST_PLUGINS"
FAULT = "ROCM_YOLO_FAULT"
RECORD_BATCHES = "ROCM_YOLO_RECORD_BATCHES"

# torch.distributed.run's, in each rank
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
SHARE_RDZV_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

# a multi-node job's, on more than one machine (a scheduler's own are its backend's: rocm_yolo.request.schedulers)
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """rocm-yolo's cache: ``$ROCM_YOLO_CACHE_DIR``, else ``$XDG_CACHE_HOME/rocm-yolo``, else ``~/.cache/rocm-yolo``."""
    if env.get(CACHE_DIR):
        return Path(env[CACHE_DIR]).expanduser()
    return xdg_cache_home(env) / "rocm-yolo"


def untrusted(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a folder (or file) of this user's own to trust: a symbolic link, or another user's;
    None when it is the user's, or missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid})"
    return None


def cache_problem(path: str | os.PathLike, env: Mapping[str, str] = os.environ) -> str | None:
    """Why ``path``, in rocm-yolo's cache (a folder of it, or a file), is not the user's own to use: the cache
    folder, or a folder or file below it down to ``path``, is a link or another user's. None when all are the
    user's (or not there yet). Another user's MIOpen kernels, demo images or self-test choice are never used."""
    root = cache_dir(env)
    path = Path(path)
    below = [path, *path.parents] if path.is_relative_to(root) else [path]
    for level in reversed([p for p in below if p == root or p.is_relative_to(root)]):
        why = untrusted(level)
        if why is not None:
            return f"{level} {why}"
    return None


def xdg_cache_home(env: Mapping[str, str] = os.environ) -> Path:
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"])
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".cache"
