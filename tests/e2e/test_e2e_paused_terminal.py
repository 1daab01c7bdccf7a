"""End to end (issue 31): the supervisor never blocks on its own terminal.

A real pseudo-terminal whose output is paused (Ctrl-S: ``tcflow(TCOOFF)``) for a whole training run: the
supervisor's loop (its heartbeat checks, its own lines) and the copy of the child's stderr go on, the child never
waits on its stderr pipe, and the run trains to its end; once the terminal takes output again (Ctrl-Q: TCOON) it
shows everything it missed, in order, and the process exits.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import termios
import threading
import tty

from helpers import TINY, epochs_in, events, wait_for
from rocm_yolo.run.paths import RunPaths


class Terminal:
    """A terminal window on a pseudo-terminal: it shows (keeps) whatever the process side lets through."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)  # no newline translation: what is shown is what was written
        self.shown = bytearray()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.shown.extend(os.read(self.master, 65536))
                except OSError:
                    return

    def pause(self, paused: bool) -> None:
        termios.tcflow(self.slave, termios.TCOOFF if paused else termios.TCOON)

    def close(self) -> str:
        self._stop.set()
        self._reader.join()
        while select.select([self.master], [], [], 0.2)[0]:
            self.shown.extend(os.read(self.master, 65536))
        os.close(self.master)
        os.close(self.slave)
        return self.shown.decode("utf-8", "replace")


def in_order(lines: list[str], text: str) -> bool:
    """Whether every line of ``lines`` is in ``text``, in that order."""
    at = 0
    for line in lines:
        at = text.find(line, at)
        if at < 0:
            return False
        at += len(line)
    return True


def test_a_paused_terminal_stops_neither_the_watchdog_nor_the_training_and_shows_all_it_missed(
    cli, tiny_data, tmp_path
):
    run = tmp_path / "runs" / "detect" / "p"
    paths = RunPaths(run)
    terminal = Terminal()
    terminal.pause(True)
    # profile single ignores workers=2, which the supervisor says before it starts the trainer
    args = ["train", str(tiny_data), "--epochs", "2", "--profile", "single", "--workers", "2", "--name", "p", *TINY]
    with open(tmp_path / "stdout.txt", "w") as out:  # the trainer's stdout (its progress bars) is not the point here
        proc = subprocess.Popen(
            [sys.executable, "-m", "rocm_yolo", *args],
            cwd=tmp_path,
            env=cli.environ(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=terminal.slave,
            start_new_session=True,  # a session leader with no terminal of its own: it must not take this one
        )
    try:
        # the whole run, watched to its end, while the terminal took nothing
        wait_for(lambda: events(run, "finished"), 240, "the run's end", proc)
        assert bytes(terminal.shown) == b"" and epochs_in(run) == [1, 2]
        assert proc.poll() is None  # what the terminal has not taken is shown before the process ends
    finally:
        terminal.pause(False)
        code = proc.wait(timeout=60)
    shown = terminal.close()
    assert code == 0, shown[-3000:]
    child = paths.child_stderr(1).read_text()
    assert "rocm-yolo: rocm-yolo " in child and in_order(child.splitlines(), shown), shown[-3000:]
    own = [m.group(1) for m in re.finditer(rf"\[{proc.pid}\] (.*)", paths.log.read_text())]  # the supervisor's
    assert any("workers=2 ignored" in line for line in own), own
    assert in_order([f"rocm-yolo: {line}" for line in own], shown), shown[-3000:]
    assert shown.rstrip().splitlines()[-1].startswith("rocm-yolo: done: 2 epochs")
    assert "output not shown" not in shown and cli.leftovers() == []
