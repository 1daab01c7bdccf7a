"""Run a command and say which kinds of process used the machine's CPU while it ran (Linux, /proc).

    python benchmarks/cpu_by_process.py -- python -m pytest -q            # the whole suite, by process kind
    python benchmarks/cpu_by_process.py --json out.json -- make test

``/usr/bin/time`` and pytest's own figures miss the processes reaped by init (a fork server after its trainer,
orphaned workers); this reads every process that appears while the command runs, twice a second, and keeps the
newest user+system time each had. A process's kind comes from its command line (a ``rocm_yolo.trainer`` started by
torch's agent is a rank); a process of under half a second may be missed, and each keeps what it used up to its
last reading. Processes that existed before the command are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter

HZ = os.sysconf("SC_CLK_TCK")
KINDS = (  # the first that matches the command line
    ("rocm_yolo.ddp.torchrun", "torch agent"),  # torch.distributed.run, its arguments ending in rocm_yolo.trainer
    ("rocm_yolo.trainer", "trainer"),
    ("rocm_yolo.ddp", "DDP launcher"),
    ("resource_tracker", "resource tracker"),
    ("rocm_yolo", "rocm-yolo command (supervisor, status, ...)"),
    ("ipykernel", "Jupyter kernel"),
    ("benchmarks/", "benchmark script"),
    ("exec(eval(sys.stdin.readline()))", "pytest worker"),
    ("pytest", "pytest"),
    ("python", "other Python"),
)


def kind(cmdline: str, parent: str | None) -> str:
    found = next((name for key, name in KINDS if key in cmdline), "other: " + cmdline.split(" ")[0].split("/")[-1])
    if found == "trainer" and parent == "torch agent":
        return "rank"  # torch's agent runs the ranks: `-m rocm_yolo.trainer SPEC`
    if found == "trainer" and parent in (None, "trainer", "rank", "fork server or DataLoader worker"):
        # a fork of a trainer or rank has its command line (the fork server, its workers), and so has one whose
        # parent has gone (a fork server outlives its trainer by a moment; init is its parent then)
        return "fork server or DataLoader worker"
    return found


def sample(seen: dict, before: set[int]) -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in before:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            ppid, ticks, start = int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])
            known = seen.get(pid)
            if known is not None and known["start"] == start:
                known["ticks"] = ticks
                continue
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read().replace("\0", " ").strip()
            parent = seen.get(ppid, {}).get("kind")
            seen[pid] = {"start": start, "ticks": ticks, "kind": kind(cmdline, parent)}
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("give the command to run after --")
    before = {int(n) for n in os.listdir("/proc") if n.isdigit()}
    seen: dict[int, dict] = {}
    done = threading.Event()

    def loop():
        while not done.is_set():
            sample(seen, before)
            done.wait(a.interval)

    reader = threading.Thread(target=loop, daemon=True)
    began = time.monotonic()
    reader.start()
    code = subprocess.call(command)
    done.set()
    reader.join()
    sample(seen, before)
    seen.pop(os.getpid(), None)
    cpu, count = Counter(), Counter()
    for record in seen.values():
        cpu[record["kind"]] += record["ticks"] / HZ
        count[record["kind"]] += 1
    total = sum(cpu.values())
    print(f"\n{time.monotonic() - began:.0f} s, {total:.0f} CPU-seconds in new processes (exit {code}):")
    for name, seconds in cpu.most_common():
        print(f"  {seconds:8.1f} s  {count[name]:5d}  {name}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({name: {"cpu_s": round(s, 1), "processes": count[name]} for name, s in cpu.items()}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
