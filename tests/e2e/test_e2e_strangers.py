"""End to end, nobody else gets in (issue 45): what another user (or program) of the machine could plant where a run
trains, and what a run leaves open to them, on real trainings.

- Modules planted in the folder the user trains from (``psutil.py``, ``yaml.py``) never run in any process of a
  run: supervisor, DDP launcher, torch's agent, ranks, fork servers, DataLoader workers.
- Under a umask that lets the group write, rocm-yolo's folder of the run is the user's alone (0700, files 0600).
- On one machine no process of a run listens beyond the loopback interface (torch's store, gloo).
- A trainer SIGKILLed in the middle leaves no multiprocessing folder in /tmp, and no stack file stays.
- A class name with terminal escape sequences shows as text: what reaches the terminal keeps colours only.
- A lock planted as a link in a folder trained into again is refused in one line, its target untouched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import threading
from pathlib import Path

import psutil

from helpers import TINY, epochs_in, events, rocm_lines, with_cpu_ranks
from rocm_yolo.run.paths import RunPaths

DDP = ["--model", "yolo26n.yaml", "--device", "0,1", "--imgsz", "32", "--batch", "4", "plots=False"]
UMASK_002 = ("sh", "-c", 'umask 002; exec "$@"', "sh")  # the CLI under a umask that lets the group write
PLANTED = ("psutil", "yaml", "requests")  # modules the run's processes import


def plant_modules(where: Path) -> Path:
    """Modules a stranger leaves in a shared folder: each, if ever imported, says so in a marker and fails."""
    markers = where / "markers"
    markers.mkdir()
    for name in PLANTED:
        (where / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'a').write(__import__('os').getpid().__str__() + '\\n')\n"
            f"raise ImportError('a stranger planted {name}.py here')\n"
        )
    return markers


def listening(cli) -> set[tuple[str, str]]:
    """The TCP sockets the run's processes listen on now: (process name, address)."""
    found = set()
    for proc in cli.tagged.processes():
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((proc.name(), conn.laddr.ip))
        except psutil.Error:
            continue
    return found


def private(state: Path) -> list[str]:
    """What of rocm-yolo's folder is not the user's alone: each folder 0700, each file 0600."""
    wrong = []
    for path in [state, *state.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        if stat.S_IMODE(path.lstat().st_mode) != want or path.is_symlink():
            wrong.append(f"{path.relative_to(state)} {oct(stat.S_IMODE(path.lstat().st_mode))}")
    return wrong


def test_ddp_ranks_import_nothing_from_the_working_directory_keep_their_folder_private_and_listen_on_loopback(
    cli, tiny_data, tmp_path
):
    with_cpu_ranks(cli)
    markers = plant_modules(cli.cwd)
    run = tmp_path / "runs" / "detect" / "train"
    seen: set[tuple[str, str]] = set()
    proc = cli.start("train", str(tiny_data), *DDP, "--epochs", "1", "--workers", "1", prefix=UMASK_002)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.update(listening(cli))
            watching.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = cli.wait(proc, timeout=400)
    finally:
        watching.set()
        watcher.join()
    assert r.returncode == 0, r.stdout[-4000:]
    assert list(markers.iterdir()) == [] and epochs_in(run) == [1]  # nothing planted ran, in any process
    assert seen, "no listening socket seen: the agent's store was missed"
    assert all(ipaddress.ip_address(ip).is_loopback for _, ip in seen), seen  # torch's store and gloo: loopback
    state = RunPaths(run).state
    assert private(state) == []
    assert not RunPaths(run).stacks.exists()  # every process gone: its stack file too
    assert not list(state.glob("forkserver-imports*"))  # the fork servers' names came over pipes
    assert cli.leftovers() == []


def test_a_killed_trainer_leaves_no_tmp_folder_and_escape_sequences_in_class_names_show_as_text(
    cli, tiny_data, tmp_path
):
    data = tmp_path / "data.yaml"
    evil = "evil\x1b]52;c;cm0gLXJmIH4=\x07name\x1b[2J"
    names = json.dumps({0: evil, 1: "circle", 2: "triangle"})  # JSON is YAML: the escapes as \u sequences
    data.write_text(f"path: {tiny_data.parent}\ntrain: images/train\nval: images/val\nnames: {names}\n")
    run = tmp_path / "runs" / "detect" / "train"
    r = cli.run(
        "train", str(data), *TINY, "--epochs", "2", "--workers", "1", "--stall-timeout", "20",
        env={"ROCM_YOLO_FAULT": "kill@1:2"}, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:]
    assert epochs_in(run) == [1, 2] and len(events(run, "restart")) == 1
    temps = [Path(e["path"]) for e in events(run, "mp_tempdir")]
    assert len(temps) == 2 and not any(p.exists() for p in temps)  # the killed trainer's too
    assert not RunPaths(run).stacks.exists()
    output = cli.output.read_bytes()
    assert b"evil" in output and b"\x1b]" not in output and b"\x07" not in output and b"\x1b[2J" not in output
    assert cli.leftovers() == []


def test_a_lock_planted_as_a_link_in_a_folder_trained_into_again_is_refused_in_one_line(cli, tiny_data, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    run = tmp_path / "runs" / "detect" / "shared"
    RunPaths(run).state.mkdir(parents=True)
    os.symlink(victim, RunPaths(run).lock)
    r = cli.run("train", str(tiny_data), *TINY, "--name", "shared", "exist_ok=True", timeout=120)
    lines = rocm_lines(r.stdout) + [line for line in r.stdout.splitlines() if "error" in line]
    assert r.returncode == 2 and "symbolic link" in r.stdout and "Traceback" not in r.stdout, r.stdout[-2000:]
    assert victim.read_text() == "the user's file" and lines
    assert cli.leftovers() == []
