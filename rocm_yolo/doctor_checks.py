"""The doctor's checks: system, GPU, shared memory, start method, conv self-test, kernel log.

Each ``check_*`` function takes the :class:`~rocm_yolo.doctor.Options` and yields
:class:`~rocm_yolo.doctor.Row` objects. The data set and DataLoader checks live in
:mod:`rocm_yolo.doctor_data`. Anything that imports torch runs in a subprocess started in
its own session and killed as a whole process group on timeout (:func:`run_bounded`), so
no check can hang the doctor or leave a process behind.
"""

from __future__ import annotations

import json
import os
import re
import resource
import stat
import sys
from pathlib import Path
from typing import Iterator

from rocm_yolo.doctor_model import FAIL, OK, SKIP, WARN, Options, Row, loader_plan
from rocm_yolo.proctree import Outcome, run_bounded

FIX_GROUPS = "sudo usermod -aG render,video $USER, then log out and back in (or reboot)"
RDNA1_HINT = "gfx101x (RX 5500/5600/5700)"


# ---------------------------------------------------------------------------------------
# bounded subprocesses


def python_json(opts: Options, code: str, timeout: float, env: dict | None = None) -> tuple[dict | None, Outcome]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last stdout line."""
    outcome = run_bounded([opts.python, "-c", code], timeout, env)
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


def torch_import_error(opts: Options) -> str | None:
    """Why ``import torch`` fails in a fresh interpreter (its last error line), or None if it works."""
    result, outcome = python_json(opts, TORCH_IMPORT_PROBE, min(opts.timeout, 120))
    if result is not None:
        return None
    if outcome.timed_out:
        return f"import torch did not finish in {outcome.seconds:.0f} s"
    tail = outcome.tail(1)
    return tail[0] if tail else (f"killed by {outcome.signal_name}" if outcome.signal_name else
                                 f"exit code {outcome.returncode}")


def check_versions(opts: Options, gpus: list | None, torch_error: str | None = None) -> Iterator[Row]:
    from rocm_yolo.rocm import torch_build

    yield Row("versions.python", "Python", OK, f"{sys.version.split()[0]} ({opts.python})")
    build = torch_build()
    kind = torch_kind(build)
    have_gpu = bool(gpus)
    data = dict(build, kind=kind)
    if build.get("path") is None:
        yield Row("versions.torch", "torch", FAIL, "not installed", "pip install torch from the ROCm index "
                  "(https://pytorch.org/get-started/locally/, choose ROCm)", data=data)
    elif torch_error is not None:
        yield Row("versions.torch", "torch", FAIL, f"{build['torch'] or 'torch'} at {build['path']} fails to import: "
                  f"{torch_error}", "reinstall torch (pip install --force-reinstall torch ...; on an AMD GPU from the "
                  "ROCm index) or fix what the error names (a missing library, a broken PYTHONPATH)",
                  data=dict(data, error=torch_error,
                            verdict="torch cannot be imported: fix that first, nothing else can be tested"))
    else:
        label = {"hip": f"ROCm/HIP {build['hip']} build", "cuda": f"CUDA {build['cuda']} build", "cpu": "CPU-only build"}[kind]
        status, fix = OK, None
        if have_gpu and kind != "hip":
            status = FAIL
            fix = ("this torch cannot use the AMD GPU: install a ROCm build, e.g. "
                   "pip install torch torchvision --index-url https://download.pytorch.org/whl/rocm6.2")
        yield Row("versions.torch", "torch", status, f"{build['torch']}, {label}", fix, data=data)
    ultra = _metadata_version("ultralytics")
    if ultra:
        from rocm_yolo import compat  # imports neither torch nor Ultralytics

        outside = compat.untested(ultra)
        yield Row("versions.ultralytics", "Ultralytics", WARN if outside else OK,
                  f"{ultra}, outside the tested range {compat.SUPPORTED_ULTRALYTICS}" if outside else ultra,
                  f"pip install 'ultralytics{compat.SUPPORTED_ULTRALYTICS}'" if outside else None,
                  data={"version": ultra, "tested": compat.SUPPORTED_ULTRALYTICS})
    else:
        yield Row("versions.ultralytics", "Ultralytics", FAIL, "not installed", "pip install ultralytics")
    root = _rocm_root(opts)
    version = rocm_version(root)
    if version:
        yield Row("versions.rocm", "ROCm", OK, f"{version} at {root}", data={"version": version, "path": str(root)})
    elif kind == "hip":
        yield Row("versions.rocm", "ROCm", SKIP, f"no system ROCm at {root} (the ROCm torch wheel brings its own runtime)",
                  data={"path": str(root)})
    else:
        yield Row("versions.rocm", "ROCm", SKIP, f"not found at {root}", data={"path": str(root)})


# ---------------------------------------------------------------------------------------
# 2. GPU: arch, HSA override, torch code for the arch, device files, groups


def detect_gpus(opts: Options) -> tuple[list | None, str | None]:
    """The GPUs from sysfs via :mod:`rocm_yolo.rocm`; (None, reason) if detection is unavailable."""
    try:
        from rocm_yolo import rocm
    except ImportError as e:
        return None, f"rocm_yolo.rocm unavailable ({e})"
    kfd = opts.kfd_root
    if kfd is None and opts.root != Path("/"):
        kfd = str(opts.path(rocm.KFD_ROOT))
    try:
        return rocm.detect_gpus(kfd), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def parse_gfx_version(text: str) -> tuple[int, int, int] | None:
    """``"10.3.0"`` -> (10, 3, 0); None if malformed."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def arch_tuple(arch: str) -> tuple[int, int, int] | None:
    """``"gfx1010"`` -> (10, 1, 0), ``"gfx90a"`` -> (9, 0, 10)."""
    m = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", (arch or "").split(":")[0])
    return (int(m[1]), int(m[2], 16), int(m[3], 16)) if m else None


def arch_name(t: tuple[int, int, int]) -> str:
    return f"gfx{t[0]}{t[1]:x}{t[2]:x}"


def override_row(arch: str | None, value: str | None) -> Row:
    """``HSA_OVERRIDE_GFX_VERSION`` against the card's arch."""
    check, name = "gpu.override", "HSA override"
    if not value:
        return Row(check, name, OK, "HSA_OVERRIDE_GFX_VERSION not set")
    parsed = parse_gfx_version(value)
    if parsed is None:
        return Row(check, name, FAIL, f"HSA_OVERRIDE_GFX_VERSION={value} is not of the form X.Y.Z",
                   "unset it (unset HSA_OVERRIDE_GFX_VERSION) or give a version such as 10.3.0")
    target = arch_name(parsed)
    card = arch_tuple(arch) if arch else None
    data = {"value": value, "runs_as": target, "card": arch}
    if card is None:
        return Row(check, name, WARN, f"HSA_OVERRIDE_GFX_VERSION={value} (runs as {target}) but no AMD GPU was detected",
                   "unset it unless you know why it is set", data=data)
    family = f"gfx{card[0]}{card[1]:x}x"
    fitting = f"{card[0]}.{card[1]}.0"
    if parsed == card:
        return Row(check, name, OK, f"HSA_OVERRIDE_GFX_VERSION={value} matches the {arch} card", data=data)
    if parsed[:2] == card[:2]:
        return Row(check, name, OK, f"HSA_OVERRIDE_GFX_VERSION={value} fits the {arch} card ({family})", data=data)
    found = f"HSA_OVERRIDE_GFX_VERSION={value} runs the {arch} card as {target}, another family"
    if parsed[0] == card[0]:
        why = " (it crashes some RX 5700 cards)" if family == "gfx101x" else ""
        return Row(check, name, WARN, found + why,
                   f"use {fitting}, which fits {family}, or unset it; keep {value} only if a test run is stable", data=data)
    return Row(check, name, FAIL, found + " of another generation: kernels will fault or hang",
               f"unset HSA_OVERRIDE_GFX_VERSION or set {fitting}", data=data)


def _access(opts: Options, path: Path) -> bool:
    """Read-write access for the user (the real one via os.access; a fake one via mode bits)."""
    if opts.uid is None:
        return os.access(path, os.R_OK | os.W_OK)
    if opts.uid == 0:
        return True
    st = path.stat()
    gids = {_group_gid(opts, g) for g in (opts.groups or ())}
    if st.st_uid == opts.uid:
        bits = stat.S_IRUSR | stat.S_IWUSR
    elif st.st_gid in gids:
        bits = stat.S_IRGRP | stat.S_IWGRP
    else:
        bits = stat.S_IROTH | stat.S_IWOTH
    return st.st_mode & bits == bits


def _group_db(opts: Options) -> dict[str, tuple[int, set[str]]]:
    """name -> (gid, members): ROOT/etc/group for a fake root, the system's group database otherwise."""
    if opts.root != Path("/"):
        db = {}
        try:
            for line in opts.path("/etc/group").read_text().splitlines():
                parts = line.split(":")
                if len(parts) >= 4 and parts[2].isdigit():
                    db[parts[0]] = (int(parts[2]), {m for m in parts[3].split(",") if m})
        except OSError:
            pass
        return db
    import grp

    db = {}
    for name in ("render", "video"):  # by name: enumerating a directory service can be slow
        try:
            g = grp.getgrnam(name)
            db[name] = (g.gr_gid, set(g.gr_mem))
        except KeyError:
            pass
    return db


def _group_gid(opts: Options, name: str) -> int | None:
    entry = _group_db(opts).get(name)
    return entry[0] if entry else None


def _identity(opts: Options) -> tuple[int, str, set[str]]:
    """(uid, user name, names of this session's groups)."""
    if opts.uid is not None:
        return opts.uid, opts.user or str(opts.uid), set(opts.groups or ())
    import grp
    import pwd

    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    names = set()
    for gid in set(os.getgroups()) | {os.getgid()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    return uid, user, names


def check_gpu(opts: Options, gpus: list | None, why: str | None) -> Iterator[Row]:
    env_override = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if gpus is None:
        yield Row("gpu.arch", "GPU", WARN, f"GPU detection unavailable: {why}", "reinstall rocm-yolo")
        return
    if not gpus:
        yield Row("gpu.arch", "GPU", SKIP, "no AMD GPU in the KFD topology (/sys/class/kfd): GPU checks skipped",
                  data={"gpus": []})
        if env_override:
            yield override_row(None, env_override)
        return
    desc = ", ".join(f"{g.arch} (node {g.node}" + (f", device 0x{g.device_id:04x}" if g.device_id else "") + ")" for g in gpus)
    yield Row("gpu.arch", "GPU", OK, desc, data={"gpus": [{"node": g.node, "arch": g.arch, "gfx_target_version":
                                                            g.gfx_target_version, "device_id": g.device_id} for g in gpus]})
    yield override_row(gpus[0].arch, env_override)
    yield from _device_rows(opts, gpus)


def _device_rows(opts: Options, gpus: list) -> Iterator[Row]:
    uid, user, session = _identity(opts)
    kfd = opts.path("/dev/kfd")
    dri = opts.path("/dev/dri")
    renders = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    if not kfd.exists() or not renders:
        missing = " and ".join(x for x, ok in (("/dev/kfd", kfd.exists()), ("/dev/dri/renderD*", renders)) if not ok)
        yield Row("gpu.devices", "GPU device files", FAIL, f"{missing} missing although the driver reports a GPU",
                  "in Docker: docker run --device=/dev/kfd --device=/dev/dri --group-add video --group-add render ...; "
                  "otherwise load the amdgpu driver (sudo modprobe amdgpu) and check dmesg")
        return
    denied = [str(p).replace(str(opts.root).rstrip("/"), "", 1) if opts.root != Path("/") else str(p)
              for p in [kfd, *renders] if not _access(opts, p)]
    db = _group_db(opts)
    wanted = [g for g in ("render", "video") if g in db]
    configured = {g for g in wanted if user in db[g][1]}
    missing_session = [g for g in wanted if g not in session]
    data = {"user": user, "denied": denied, "session_groups": sorted(session & set(wanted)),
            "configured_groups": sorted(configured)}
    if denied:
        yield Row("gpu.devices", "GPU device access", FAIL, f"{user} cannot read and write {', '.join(denied)}",
                  FIX_GROUPS, data=data)
    else:
        yield Row("gpu.devices", "GPU device access", OK, f"read-write access to /dev/kfd and {len(renders)} render node(s)",
                  data=data)
    if uid == 0:
        yield Row("gpu.groups", "render/video groups", OK, "running as root", data=data)
    elif not missing_session:
        yield Row("gpu.groups", "render/video groups", OK, f"{user} is in {', '.join(wanted) or 'the GPU groups'}", data=data)
    else:
        status = FAIL if denied else WARN
        pending = [g for g in missing_session if g in configured]
        if pending and len(pending) == len(missing_session):
            yield Row("gpu.groups", "render/video groups", status,
                      f"{user} was added to {', '.join(pending)} but this session does not have it yet",
                      "log out and back in (or run: newgrp render)", data=data)
        else:
            extra = "" if denied else " (access works now, e.g. through a desktop-seat ACL, but not over ssh or in services)"
            yield Row("gpu.groups", "render/video groups", status,
                      f"{user} is not in {', '.join(missing_session)}{extra}", FIX_GROUPS, data=data)


GPU_PROBE = r"""
import json, sys
r = {}
try:
    import torch
    r["torch"] = torch.__version__
    try:
        r["arch_flags"] = torch._C._cuda_getArchFlags()
    except Exception:
        r["arch_flags"] = None
    r["available"] = torch.cuda.is_available()
    print(json.dumps(dict(r, stage="imported")), flush=True)
    if r["available"]:
        p = torch.cuda.get_device_properties(0)
        r["name"], r["gcn"] = p.name, getattr(p, "gcnArchName", None)
        x = torch.arange(4096, device="cuda", dtype=torch.float32)
        s = float((x * 2).sum().item())
        torch.cuda.synchronize()
        r["kernel_ok"] = abs(s - 4095 * 4096) < 1.0
        r["sum"] = s
except Exception as e:
    r["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
print(json.dumps(r), flush=True)
"""


def check_torch_gpu(opts: Options, gpus: list | None, kind: str) -> Iterator[Row]:
    """Whether torch carries code for the arch, and a tiny kernel launch, in a subprocess."""
    if not gpus:
        yield Row("gpu.torch_arch", "torch code for GPU", SKIP, "no GPU: skipped")
        yield Row("gpu.kernel", "GPU kernel launch", SKIP, "no GPU: skipped")
        return
    if kind != "hip":
        yield Row("gpu.torch_arch", "torch code for GPU", SKIP, "torch is not a ROCm build (see the torch row)")
        yield Row("gpu.kernel", "GPU kernel launch", SKIP, "torch is not a ROCm build")
        return
    arch = gpus[0].arch
    override = parse_gfx_version(os.environ.get("HSA_OVERRIDE_GFX_VERSION", ""))
    effective = arch_name(override) if override else arch
    result, outcome = python_json(opts, GPU_PROBE, min(opts.timeout, 120))
    flags = (result or {}).get("arch_flags") or ""
    archs = sorted({a.split(":")[0] for a in re.findall(r"gfx[0-9a-f]+(?::[^\s;,]*)?", flags)})
    data = {"effective_arch": effective, "torch_archs": archs}
    if archs:
        if effective in archs:
            yield Row("gpu.torch_arch", "torch code for GPU", OK, f"this torch build has {effective} code", data=data)
        else:
            same = [a for a in archs if (arch_tuple(a) or (0,))[:2] == (arch_tuple(effective) or (1,))[:2]]
            hint = (f"HSA_OVERRIDE_GFX_VERSION={'.'.join(map(str, arch_tuple(same[0])))} runs it as {same[0]}"
                    if same else "a torch built with PYTORCH_ROCM_ARCH=" + effective)
            yield Row("gpu.torch_arch", "torch code for GPU", FAIL,
                      f"this torch build has no {effective} code (it has {', '.join(archs)})",
                      f"install a torch built for {effective}, or try {hint}", data=data)
    else:
        yield Row("gpu.torch_arch", "torch code for GPU", SKIP, "torch does not list its GPU architectures; see the kernel launch row",
                  data=data)
    if outcome.timed_out:
        yield Row("gpu.kernel", "GPU kernel launch", FAIL, f"a tiny kernel did not finish in {outcome.seconds:.0f} s (GPU hang)",
                  "check the HSA override and kernel log rows; reboot to reset the GPU", details=outcome.tail())
    elif result is None or outcome.signal_name:
        yield Row("gpu.kernel", "GPU kernel launch", FAIL,
                  f"torch crashed ({outcome.signal_name or f'exit {outcome.returncode}'}) launching a tiny kernel",
                  "typical of an HSA_OVERRIDE_GFX_VERSION that does not fit the card or a missing arch in the torch build",
                  details=outcome.tail())
    elif result.get("error"):
        err = result["error"]
        fix = ("this torch build has no code for the GPU: see the torch code row"
               if re.search(r"invalid device function|no kernel image|hipErrorNoBinaryForGpu", err) else
               "see the device access and groups rows; HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES may hide the GPU")
        yield Row("gpu.kernel", "GPU kernel launch", FAIL, err, fix)
    elif not result.get("available"):
        yield Row("gpu.kernel", "GPU kernel launch", FAIL, "torch.cuda.is_available() is False",
                  "see the device access and groups rows; check HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES")
    elif not result.get("kernel_ok"):
        yield Row("gpu.kernel", "GPU kernel launch", FAIL, f"a tiny kernel returned a wrong result ({result.get('sum')})",
                  "the GPU computes wrong numbers: check the HSA override row")
    else:
        yield Row("gpu.kernel", "GPU kernel launch", OK, f"a tiny kernel ran on {result.get('name')} ({result.get('gcn')})",
                  data={"name": result.get("name"), "gcn": result.get("gcn")})


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
        return Row("shm.size", "shared memory", FAIL, f"/dev/shm is {_gib(total)}{docker}, {how} need ~{_gib(need)}",
                   "Docker: run with --shm-size=8g or --ipc=host; otherwise: sudo mount -o remount,size=8G /dev/shm; "
                   "or use fewer --workers / a smaller --batch", data=data)
    if free < need:
        return Row("shm.size", "shared memory", WARN, f"/dev/shm has {_gib(free)} free of {_gib(total)}, {how} need ~{_gib(need)}",
                   "free /dev/shm (stale files of crashed runs: ls -la /dev/shm) or use fewer --workers", data=data)
    return Row("shm.size", "shared memory", OK, f"/dev/shm {_gib(free)} free, need ~{_gib(need)} ({how})", data=data)


def check_shm(opts: Options) -> Iterator[Row]:
    plan = loader_plan(opts)
    need = shm_need(plan["workers"], plan["val_workers"], plan["prefetch"], opts.batch, opts.imgsz)
    shm = opts.path("/dev/shm")
    how = (f"{plan['workers']} workers + {plan['val_workers']} val workers x prefetch {plan['prefetch']} x batch "
           f"{opts.batch} at {opts.imgsz} px")
    try:
        st = os.statvfs(shm)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as e:
        total = free = None
        err = e
    if total is None:
        yield Row("shm.size", "shared memory", FAIL, f"/dev/shm not usable ({err.strerror})",
                  "DataLoader workers pass batches through /dev/shm: mount it (Docker: --shm-size=8g or --ipc=host)",
                  data=dict(plan, need=need))
    else:
        yield shm_row(total, free, need, plan, how)
    soft, hard = opts.nofile or resource.getrlimit(resource.RLIMIT_NOFILE)
    data = {"soft": soft, "hard": hard}
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if plan["workers"] and soft != resource.RLIM_INFINITY and soft < 4096:
        yield Row("shm.nofile", "open-file limit", WARN, f"{shown} (hard {hard}): workers share batches through file descriptors",
                  "ulimit -n 65536 before training (Docker: --ulimit nofile=65536:65536)", data=data)
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
        yield Row("start.method", "start method", WARN, "a fresh Python interpreter failed to report its start method",
                  "run python -c 'import multiprocessing as m; print(m.get_start_method())' and look at the error",
                  details=outcome.tail())
        return
    hooks = [p for p in result["hooks"].values() if p]
    culprits = [p for p in hooks if _mentions_fork(p)]
    data = dict(result, culprits=culprits)
    before = result["before"]
    if result["after"] != "spawn":
        yield Row("start.method", "start method", FAIL, f"spawn could not be set (got {result['after']})",
                  "report this as a bug", data=data)
    elif before in ("fork", "forkserver"):
        where = ", ".join(culprits or hooks) or "an interpreter start-up hook"
        yield Row("start.method", "start method", WARN,
                  f"a fresh interpreter already has '{before}' set (by {where}); the training child still forces spawn",
                  f"remove the set_start_method('{before}') call from {where}: your own scripts get {before}", data=data)
    elif culprits:
        yield Row("start.method", "start method", WARN, f"{', '.join(culprits)} mentions a fork start method",
                  "check that start-up hook; the training child forces spawn", data=data)
    else:
        yield Row("start.method", "start method", OK,
                  f"nothing forces one at start-up (default {result['default']}); the training child sets spawn "
                  "and its workers fork from a preloaded server", data=data)
    startup = result.get("startup")
    if startup and _mentions_fork(startup):
        yield Row("start.startup", "PYTHONSTARTUP", WARN, f"{startup} sets a fork start method (interactive sessions only)",
                  f"remove it from {startup}, or start notebooks and REPL training with spawn", data={"path": startup})


# ---------------------------------------------------------------------------------------
# 7. conv self-test


def check_conv(opts: Options, gpus: list | None, kind: str) -> Iterator[Row]:
    if not gpus or kind != "hip":
        yield Row("conv.selftest", "conv self-test", SKIP,
                  "no GPU: skipped (strategies only differ on a GPU)" if not gpus else "torch is not a ROCm build: skipped")
        return
    try:
        from rocm_yolo import convtest, rocm
    except ImportError as e:
        yield Row("conv.selftest", "conv self-test", WARN, f"conv self-test unavailable ({e})", "reinstall rocm-yolo")
        return
    # Test what training would run: the architecture's presets (amp, MIOpen variables) where the user set nothing.
    arch = gpus[0].arch
    presets = rocm.presets(arch, {}, os.environ)
    amp = not any(p.key == "amp" for p in presets)
    env = dict(os.environ, **{p.key: str(p.value) for p in presets if p.kind == "env" and not p.user_set})
    try:
        results = convtest.run_selftest("cuda", timeout=max(opts.timeout, 300), amp=amp, env=env)
    except Exception as e:  # noqa: BLE001
        yield Row("conv.selftest", "conv self-test", WARN, f"conv self-test failed to run: {type(e).__name__}: {e}")
        return
    chosen = convtest.choose(results)
    details = [f"{s}: " + (f"ok, {r['time_s'] * 1e3:.1f} ms per step, max err {r['max_err']:.2g}" if r.get("ok")
                           else f"failed ({r.get('error')})") for s, r in results.items()]
    path = convtest.default_cache_dir() / convtest.CACHE_FILE
    entry = convtest.cached_entry(path, convtest.cache_key(arch, rocm.torch_build(), amp))
    if entry is not None:
        details.append(f"training uses the choice cached in {path}: {entry['strategy']} "
                       f"({convtest.timings_text(entry['results'], entry['strategy'])}); delete the file to test again")
    data = {"results": results, "auto": chosen, "amp": amp}
    if chosen is None:
        yield Row("conv.selftest", "conv self-test", FAIL, "no convolution strategy works on this GPU",
                  "check the torch code and HSA override rows; train on the CPU meanwhile (device=cpu)", details, data)
        return
    timings = convtest.timings_text(results, chosen)
    if results.get("native", {}).get("ok"):
        yield Row("conv.selftest", "conv self-test", OK,
                  f"native convolutions work; auto picks {chosen} ({timings})", None, details, data)
    else:
        yield Row("conv.selftest", "conv self-test", WARN,
                  f"native (MIOpen) convolutions fail; auto picks {chosen} ({timings})",
                  f"train with --conv auto (or --conv {chosen})", details, data)


# ---------------------------------------------------------------------------------------
# 8. kernel log

KERNEL_PATTERNS = (
    ("userptr", re.compile(r"amdgpu_amdkfd_restore_userptr_worker")),
    ("hogged CPU", re.compile(r"hogged CPU", re.I)),
    ("GPU reset", re.compile(r"GPU reset|gpu_recover|GPU recovery|reset (begin|succeeded|failed)", re.I)),
    ("ring timeout", re.compile(r"ring \S+ timeout|\btimeout\b.*\bring\b", re.I)),
    ("page fault", re.compile(r"page fault|VM_L2_PROTECTION_FAULT|retry fault|memory access fault", re.I)),
)
_AMD = re.compile(r"amdgpu|amdkfd|\bkfd\b", re.I)


def read_kernel_log(opts: Options) -> tuple[str | None, str]:
    """(log text or None, source or the reason it is unreadable)."""
    if opts.kernel_log is not None:
        try:
            return opts.kernel_log.read_text(errors="replace"), str(opts.kernel_log)
        except OSError as e:
            return None, f"{opts.kernel_log}: {e.strerror}"
    reasons = []
    for cmd in (["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-n", "20000"]):
        try:
            outcome = run_bounded(cmd, 10)
        except OSError as e:
            reasons.append(f"{cmd[0]}: {e.strerror}")
            continue
        text = outcome.stdout
        if outcome.returncode == 0 and text.strip() and "No entries" not in text[:200]:
            return text, " ".join(cmd[:2])
        reasons.append(f"{cmd[0]}: " + ((outcome.tail(1) or ["no output"])[0] if not outcome.timed_out else "timed out"))
    return None, "; ".join(reasons)


def scan_kernel_log(text: str) -> tuple[dict[str, int], list[str]]:
    counts: dict[str, int] = {}
    lines = []
    for line in text.splitlines():
        if not _AMD.search(line):
            continue
        hit = [name for name, rx in KERNEL_PATTERNS if rx.search(line)]
        if hit:
            for name in hit:
                counts[name] = counts.get(name, 0) + 1
            lines.append(line.strip())
    return counts, lines


def check_kernel_log(opts: Options) -> Iterator[Row]:
    text, source = read_kernel_log(opts)
    if text is None:
        yield Row("kernel.log", "kernel log", SKIP, f"not readable ({source})",
                  "look yourself: sudo dmesg | grep -i amdgpu", data={"source": source})
        return
    counts, lines = scan_kernel_log(text)
    data = {"source": source, "counts": counts, "lines": lines[-50:]}
    if not counts:
        yield Row("kernel.log", "kernel log", OK, f"no amdgpu hangs, resets or faults ({source})", data=data)
        return
    fixes = []
    if "userptr" in counts or "hogged CPU" in counts:
        fixes.append("restore_userptr/hogged CPU is the sign of fork()ed DataLoader workers holding GPU memory: "
                     "train through rocm-yolo (spawn workers), --profile safe if it persists")
    if {"GPU reset", "ring timeout"} & set(counts):
        fixes.append("the GPU hung and was reset: check the HSA override row, try --profile safe or a smaller --batch")
    if "page fault" in counts:
        fixes.append("GPU page faults: usually code for the wrong arch (HSA override) or a driver bug")
    found = ", ".join(f"{n} x{c}" for n, c in counts.items()) + f" ({source})"
    details = [x[:160] for x in lines[-5:]]
    yield Row("kernel.log", "kernel log", WARN, found, "; ".join(fixes), details, data)


# ---------------------------------------------------------------------------------------


def run_all(opts: Options) -> Iterator[Row]:
    """Every check not in ``opts.skip``, in order."""
    from rocm_yolo.rocm import torch_build

    gpus, why = detect_gpus(opts) if {"versions", "gpu", "conv"} - opts.skip else (None, None)
    build = torch_build()
    kind = torch_kind(build)
    loader_check = opts.data is not None and "loader" not in opts.skip
    torch_error = None
    if not build.get("path"):
        torch_error = "torch is not installed"
    elif "versions" not in opts.skip or loader_check:
        torch_error = torch_import_error(opts)
    if "versions" not in opts.skip:
        yield from check_versions(opts, gpus, torch_error if build.get("path") else None)
    if "gpu" not in opts.skip:
        yield from check_gpu(opts, gpus, why)
        yield from check_torch_gpu(opts, gpus, kind)
    if "shm" not in opts.skip:
        yield from check_shm(opts)
    if "start" not in opts.skip:
        yield from check_start_method(opts)
    if opts.data is not None and not {"data", "loader"} <= opts.skip:
        from rocm_yolo import doctor_data

        yield from doctor_data.check_data_and_loader(opts, torch_error)
    elif "data" not in opts.skip:
        yield Row("data.yaml", "data set", SKIP, "no DATA given: pass a data YAML (or 'demo') to check data and loading")
    if "conv" not in opts.skip:
        yield from check_conv(opts, gpus, kind)
    if "kernel" not in opts.skip:
        yield from check_kernel_log(opts)
