"""How a process of the tree ends: ``exit_uncollected`` exits with its main's code, quickly, and loses nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, os, sys, threading, time
from rocm_yolo.process.lifecycle import exit_uncollected

class Said:
    def __init__(self, word):
        self.word = word
    def __del__(self):
        os.write(1, (self.word + "\\n").encode())  # late in the exit, sys.stdout may be gone

cycle = Said("collected")
cycle.me = cycle  # only a collection would free it
del cycle
atexit.register(print, "atexit ran")
writer = threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True)))

def main():
    writer.start()  # not a daemon: the exit waits for it
    if sys.argv[1] == "raise":
        raise SystemExit(143)  # a stop, as the SIGTERM handler raises it
    return int(sys.argv[1])

exit_uncollected(main)
"""


@pytest.mark.parametrize("how, code", [("3", 3), ("0", 0), ("raise", 143)])
def test_the_exit_keeps_the_code_the_atexit_handlers_and_the_threads_and_collects_no_cycle(how, code):
    r = subprocess.run([sys.executable, "-c", PROGRAM, how], capture_output=True, text=True, timeout=60)
    assert r.returncode == code, r.stderr
    lines = r.stdout.splitlines()
    assert {"atexit ran", "thread finished"} <= set(lines), r.stdout
    assert "collected" not in lines  # what the exit's collections would have walked: left to the OS
