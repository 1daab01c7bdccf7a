"""How the trainer makes its fork server: a fork of itself where that is safe, else a new interpreter.

Each case runs in a fresh process standing in for the trainer (a pytest worker has threads of its own), which
starts the server as the trainer does and reports what the server is, read from /proc.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = """
import faulthandler, json, multiprocessing.resource_tracker, os, signal, sys, threading, time
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.trainer.forkserver import server as forkserver

run = sys.argv[1]
held = open(os.path.join(run, "held.txt"), "w")  # a file of the trainer's: not the server's
signal.signal(signal.SIGTERM, lambda *a: None)  # a handler of the trainer's: not the server's
faulthandler.register(signal.SIGUSR1, file=held)  # nor its stack-dump signal
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # an ignored signal stays ignored, as across exec
if sys.argv[2] == "thread":
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
why = forkserver.start(run)
path = RunPaths(run).forkserver()
deadline = time.monotonic() + 60
while not path.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
server = forkserver.server_pid()
time.sleep(0.2)  # the record is written by the preload, before the server's loop sets its own handlers
fds = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
status = {l.split(":")[0]: l.split()[1] for l in open(f"/proc/{server}/status") if l.startswith("Sig")}
caught, ignored = int(status["SigCgt"], 16), int(status["SigIgn"], 16)
tracker = open(f"/proc/{multiprocessing.resource_tracker._resource_tracker._pid}/cmdline", "rb").read()
print("RESULT", json.dumps({"why": why, "record": json.loads(path.read_text()), "server": server,
                            "parent": os.getpid(), "fds": fds, "caught": caught, "ignored": ignored,
                            "tracker": tracker.decode(errors="replace")}))
"""


def start_server(tmp_path, how: str) -> dict:
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, str(script), str(tmp_path), how]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "RESULT" in done.stdout, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


def test_a_single_threaded_trainer_forks_its_server_which_keeps_nothing_of_the_trainer(tmp_path):
    r = start_server(tmp_path, "alone")
    record = r["record"]
    assert r["why"] is None and record["started"] == "fork" and record["trainer"] == r["parent"]
    assert record["preload_error"] is None and record["native_threads"] == ["python"] and record["gpu_files"] == []
    assert not any(fd.endswith("held.txt") for fd in r["fds"]), r["fds"]  # on /dev/null in the server
    for sig in (signal.SIGTERM, signal.SIGUSR1):  # the default action, as in a new interpreter
        assert not r["caught"] & (1 << (sig - 1)), sig
    assert r["ignored"] & (1 << (signal.SIGHUP - 1))
    assert "resource_tracker" in r["tracker"]  # multiprocessing's resource tracker is still a new interpreter


def test_a_trainer_with_a_thread_gets_a_new_interpreter_and_says_why(tmp_path):
    r = start_server(tmp_path, "thread")
    assert "2 threads" in r["why"] and r["record"]["started"] == "exec", r
    assert r["record"]["native_threads"] == ["python"] and r["record"]["trainer"] == r["parent"]


@pytest.mark.parametrize("threads", [1, 2])
def test_a_process_with_a_thread_is_refused(threads):
    code = "from rocm_yolo.trainer.forkserver import server as forkserver; import threading, time\n"
    if threads == 2:
        code += "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    code += "print(forkserver.fork_refused())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    assert (out == "None") == (threads == 1), out
