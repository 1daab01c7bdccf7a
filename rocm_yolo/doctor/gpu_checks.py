"""The doctor's checks of the GPU: architecture and HSA override, device files and groups, torch's code for
the GPU and a tiny kernel launch, and the conv self-test.

Every check that needs torch runs in a subprocess under a time limit; the architecture is
read from sysfs (:mod:`rocm_yolo.gpu.arch`) without importing it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Iterator

from rocm_yolo.conv import selftest as convtest
from rocm_yolo.doctor import hsa_override
from rocm_yolo.doctor.multigpu import check_multi_gpu
from rocm_yolo.doctor.options import Options
from rocm_yolo.doctor.report import FAIL, OK, SKIP, WARN, Row
from rocm_yolo.doctor.system import python_json
from rocm_yolo.gpu import arch as gpu_arch
from rocm_yolo.gpu import presets as gpu_presets
from rocm_yolo.gpu import wheels
from rocm_yolo.gpu.arch import gfx_name, gfx_version, parse_override
from rocm_yolo.gpu.torch_build import torch_build

FIX_GROUPS = "sudo usermod -aG render,video $USER, then log out and back in (or reboot)"


# ---------------------------------------------------------------------------------------
# 2. GPU: arch, HSA override, torch code for the arch, device files, groups


def detect_gpus(opts: Options) -> tuple[list | None, str | None]:
    """The GPUs from sysfs (:mod:`rocm_yolo.gpu.arch`); (None, reason) if detection is unavailable."""
    kfd = opts.kfd_root
    if kfd is None and opts.root != Path("/"):
        kfd = str(opts.path(gpu_arch.KFD_ROOT))
    try:
        return gpu_arch.detect_gpus(kfd), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


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
        yield Row(
            "gpu.arch",
            "GPU",
            SKIP,
            "no AMD GPU in the KFD topology (/sys/class/kfd): GPU checks skipped",
            data={"gpus": []},
        )
        if env_override:
            yield hsa_override.override_row(None, env_override)
        return
    desc = ", ".join(g.describe() for g in gpus)
    yield Row(
        "gpu.arch",
        "GPU",
        OK,
        desc,
        data={
            "gpus": [
                {"node": g.node, "arch": g.arch, "gfx_target_version": g.gfx_target_version, "device_id": g.device_id}
                for g in gpus
            ]
        },
    )
    yield hsa_override.override_rows(gpus, os.environ)
    yield from _device_rows(opts, gpus)
    yield from check_multi_gpu(opts, gpus)


def _device_rows(opts: Options, gpus: list) -> Iterator[Row]:
    uid, user, session = _identity(opts)
    kfd = opts.path("/dev/kfd")
    dri = opts.path("/dev/dri")
    renders = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    if not kfd.exists() or not renders:
        missing = " and ".join(x for x, ok in (("/dev/kfd", kfd.exists()), ("/dev/dri/renderD*", renders)) if not ok)
        yield Row(
            "gpu.devices",
            "GPU device files",
            FAIL,
            f"{missing} missing although the driver reports a GPU",
            "in Docker: docker run --device=/dev/kfd --device=/dev/dri --group-add video --group-add render ...; "
            "otherwise load the amdgpu driver (sudo modprobe amdgpu) and check dmesg",
        )
        return
    denied = [
        str(p).replace(str(opts.root).rstrip("/"), "", 1) if opts.root != Path("/") else str(p)
        for p in [kfd, *renders]
        if not _access(opts, p)
    ]
    db = _group_db(opts)
    wanted = [g for g in ("render", "video") if g in db]
    configured = {g for g in wanted if user in db[g][1]}
    missing_session = [g for g in wanted if g not in session]
    data = {
        "user": user,
        "denied": denied,
        "session_groups": sorted(session & set(wanted)),
        "configured_groups": sorted(configured),
    }
    if denied:
        yield Row(
            "gpu.devices",
            "GPU device access",
            FAIL,
            f"{user} cannot read and write {', '.join(denied)}",
            FIX_GROUPS,
            data=data,
        )
    else:
        yield Row(
            "gpu.devices",
            "GPU device access",
            OK,
            f"read-write access to /dev/kfd and {len(renders)} render node(s)",
            data=data,
        )
    if uid == 0:
        yield Row("gpu.groups", "render/video groups", OK, "running as root", data=data)
    elif not missing_session:
        yield Row(
            "gpu.groups", "render/video groups", OK, f"{user} is in {', '.join(wanted) or 'the GPU groups'}", data=data
        )
    else:
        status = FAIL if denied else WARN
        pending = [g for g in missing_session if g in configured]
        if pending and len(pending) == len(missing_session):
            yield Row(
                "gpu.groups",
                "render/video groups",
                status,
                f"{user} was added to {', '.join(pending)} but this session does not have it yet",
                "log out and back in (or run: newgrp render)",
                data=data,
            )
        else:
            extra = (
                ""
                if denied
                else " (access works now, e.g. through a desktop-seat ACL, but not over ssh or in services)"
            )
            yield Row(
                "gpu.groups",
                "render/video groups",
                status,
                f"{user} is not in {', '.join(missing_session)}{extra}",
                FIX_GROUPS,
                data=data,
            )


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
    override = parse_override(os.environ.get("HSA_OVERRIDE_GFX_VERSION", ""))
    effective = gfx_name(override) if override else arch
    result, outcome = python_json(opts, GPU_PROBE, min(opts.timeout, 120))
    flags = (result or {}).get("arch_flags") or ""
    archs = sorted({a.split(":")[0] for a in re.findall(r"gfx[0-9a-f]+(?::[^\s;,]*)?", flags)})
    yield _torch_arch_row(arch, effective, archs)
    yield _kernel_row(result, outcome)


def _torch_arch_row(arch: str, effective: str, archs: list[str]) -> Row:
    """Whether the architecture the ``arch`` GPU runs as (``effective``) is among the ones torch was built for."""
    data = {"effective_arch": effective, "torch_archs": archs}
    if archs:
        if effective in archs:
            return Row("gpu.torch_arch", "torch code for GPU", OK, f"this torch build has {effective} code", data=data)
        else:
            return Row(
                "gpu.torch_arch",
                "torch code for GPU",
                FAIL,
                f"this torch build has no {effective} code (it has {', '.join(archs)})",
                _torch_arch_fix(arch, effective, archs),
                data=data,
            )
    else:
        return Row(
            "gpu.torch_arch",
            "torch code for GPU",
            SKIP,
            "torch does not list its GPU architectures; see the kernel launch row",
            data=data,
        )


def _torch_arch_fix(arch: str, effective: str, archs: list[str]) -> str:
    """AMD's wheels for the card where there are some, else a build for it or an override into the torch's archs."""
    choice = wheels.choose([arch], env={})
    if choice.index is not None:
        return f"install AMD's wheels for {arch}: {choice.command()}"
    same = [a for a in archs if (gfx_version(a) or (0,))[:2] == (gfx_version(effective) or (1,))[:2]]
    if same:
        value = ".".join(map(str, gfx_version(same[0])))
        return f"{choice.why}; with this torch, try HSA_OVERRIDE_GFX_VERSION={value} (runs it as {same[0]})"
    return choice.why


def _kernel_row(result: dict | None, outcome) -> Row:
    """What the tiny kernel launch in a subprocess showed."""
    if outcome.timed_out:
        return Row(
            "gpu.kernel",
            "GPU kernel launch",
            FAIL,
            f"a tiny kernel did not finish in {outcome.seconds:.0f} s (GPU hang)",
            "check the HSA override and kernel log rows; reboot to reset the GPU",
            details=outcome.tail(),
        )
    elif result is None or outcome.signal_name:
        return Row(
            "gpu.kernel",
            "GPU kernel launch",
            FAIL,
            f"torch crashed ({outcome.signal_name or f'exit {outcome.returncode}'}) launching a tiny kernel",
            "typical of an HSA_OVERRIDE_GFX_VERSION that does not fit the card or a missing arch in the torch build",
            details=outcome.tail(),
        )
    elif result.get("error"):
        err = result["error"]
        fix = (
            "this torch build has no code for the GPU: see the torch code row"
            if re.search(r"invalid device function|no kernel image|hipErrorNoBinaryForGpu", err)
            else "see the device access and groups rows; HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES may hide the GPU"
        )
        return Row("gpu.kernel", "GPU kernel launch", FAIL, err, fix)
    elif not result.get("available"):
        return Row(
            "gpu.kernel",
            "GPU kernel launch",
            FAIL,
            "torch.cuda.is_available() is False",
            "see the device access and groups rows; check HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES",
        )
    elif not result.get("kernel_ok"):
        return Row(
            "gpu.kernel",
            "GPU kernel launch",
            FAIL,
            f"a tiny kernel returned a wrong result ({result.get('sum')})",
            "the GPU computes wrong numbers: check the HSA override row",
        )
    else:
        return Row(
            "gpu.kernel",
            "GPU kernel launch",
            OK,
            f"a tiny kernel ran on {result.get('name')} ({result.get('gcn')})",
            data={"name": result.get("name"), "gcn": result.get("gcn")},
        )


# ---------------------------------------------------------------------------------------
# 7. conv self-test


def check_conv(opts: Options, gpus: list | None, kind: str) -> Iterator[Row]:
    if not gpus or kind != "hip":
        yield Row(
            "conv.selftest",
            "conv self-test",
            SKIP,
            "no GPU: skipped (strategies only differ on a GPU)" if not gpus else "torch is not a ROCm build: skipped",
        )
        return
    # Test what training would run: the architecture's presets (amp, MIOpen variables) where the user set nothing.
    arch = gpus[0].arch
    presets = gpu_presets.presets(arch, {}, os.environ)
    amp = not any(p.key == "amp" for p in presets)
    env = dict(os.environ, **{p.key: str(p.value) for p in presets if p.kind == "env" and not p.user_set})
    try:
        results = convtest.run_selftest("cuda", timeout=max(opts.timeout, 300), amp=amp, env=env)
    except Exception as e:  # noqa: BLE001
        yield Row("conv.selftest", "conv self-test", WARN, f"conv self-test failed to run: {type(e).__name__}: {e}")
        return
    chosen = convtest.choose(results)
    details = [
        f"{s}: "
        + (
            f"ok, {r['time_s'] * 1e3:.1f} ms per step, max err {r['max_err']:.2g}"
            if r.get("ok")
            else f"failed ({r.get('error')})"
        )
        for s, r in results.items()
    ]
    path = convtest.default_cache_dir() / convtest.CACHE_FILE
    entry = convtest.cached_entry(path, convtest.cache_key(arch, torch_build(), amp))
    if entry is not None:
        details.append(
            f"training uses the choice cached in {path}: {entry['strategy']} "
            f"({convtest.timings_text(entry['results'], entry['strategy'])}); delete the file to test again"
        )
    data = {"results": results, "auto": chosen, "amp": amp}
    if chosen is None:
        yield Row(
            "conv.selftest",
            "conv self-test",
            FAIL,
            "no convolution strategy works on this GPU",
            "check the torch code and HSA override rows; train on the CPU meanwhile (device=cpu)",
            details,
            data,
        )
        return
    timings = convtest.timings_text(results, chosen)
    if results.get("native", {}).get("ok"):
        yield Row(
            "conv.selftest",
            "conv self-test",
            OK,
            f"native convolutions work; auto picks {chosen} ({timings})",
            None,
            details,
            data,
        )
    else:
        yield Row(
            "conv.selftest",
            "conv self-test",
            WARN,
            f"native (MIOpen) convolutions fail; auto picks {chosen} ({timings})",
            f"train with --conv auto (or --conv {chosen})",
            details,
            data,
        )
