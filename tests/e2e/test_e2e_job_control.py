"""End to end (issue 43, item 5): a terminal's job control, as for any program, in a real terminal.

A real interactive bash on a real pseudo-terminal (its session and controlling terminal, as a terminal window gives
it), driven by what a user types: ``stty tostop``, a training started in the background with ``&``, ``fg``, Ctrl-Z,
and the window closed. A background job that writes to its terminal under ``stty tostop`` stops as a whole, the
training tree with it; one ``fg`` continues it, and the time it was stopped counts once; a stopped job whose terminal
goes away ends (SIGHUP: exit 129), whatever stopped it, with every process of its tree gone.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time

import psutil
import pytest

from helpers import TINY, epochs_in, events, wait_for
from rocm_yolo import errors
from rocm_yolo.run.paths import RunPaths

STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)

pytestmark = pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="needs bash, for a terminal's job control")


def _controlling_terminal() -> None:
    """In the shell's process, after setsid: the terminal on its stdin becomes its controlling terminal, and the signals
    a terminal sends do what they do by default, as in a shell a terminal window starts (a suite run under ``nohup``
    or in a script's background job would otherwise hand the shell, and so the training, SIGHUP or SIGINT ignored)."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGTSTP, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Shell:
    """An interactive bash in a terminal window: a pseudo-terminal whose other end this test holds."""

    def __init__(self, cwd, env: dict):
        self.master, slave = os.openpty()
        env = {**env, "TERM": "dumb", "HISTFILE": "/dev/null", "PS1": "$ "}
        self.proc = subprocess.Popen(
            ["/bin/bash", "--norc", "--noprofile", "-i"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)
        self.shown = bytearray()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:  # a terminal shows what it gets: its buffer never fills
        while not self._stop.is_set():
            try:
                if select.select([self.master], [], [], 0.1)[0]:
                    self.shown.extend(os.read(self.master, 65536))
            except OSError:
                return

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        """The window closed: the terminal's master end goes, the kernel hangs the terminal up."""
        self._stop.set()
        self._reader.join()
        os.close(self.master)

    def output(self) -> str:
        return self.shown.decode("utf-8", "replace")


def supervisor_of(cli, proc_name: str = "rocm_yolo") -> psutil.Process:
    found = [p for p in cli.tagged.processes() if "train" in p.cmdline() and proc_name in " ".join(p.cmdline())]
    found = [p for p in found if "rocm_yolo.trainer" not in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in found]
    return found[0]


def tree(supervisor: psutil.Process) -> list[psutil.Process]:
    return [supervisor, *supervisor.children(recursive=True)]


def all_stopped(supervisor: psutil.Process) -> bool:
    try:
        members = tree(supervisor)
        return len(members) >= 3 and all(p.status() in STOPPED for p in members)
    except psutil.NoSuchProcess:
        return False


def training(run) -> bool:
    from rocm_yolo.run import heartbeat

    return getattr(heartbeat.read(RunPaths(run).heartbeat), "batches_total", 0) > 0


def start_job(cli, tiny_data, tmp_path, name: str, epochs: int, background: bool) -> tuple[Shell, object]:
    """A shell in a terminal with ``stty tostop``, and the training started in it (in the background with ``&``)."""
    shell = Shell(tmp_path, cli.environ())
    args = ["train", str(tiny_data), "--epochs", str(epochs), "--workers", "1", "--name", name, *TINY]
    command = shlex.join([sys.executable, "-m", "rocm_yolo", *args])
    shell.type("stty tostop\n")
    shell.type(f"{command}{' &' if background else ''}\n")
    wait_for(lambda: any("train" in p.cmdline() for p in cli.tagged.processes()), 60, "the job")
    return shell, tmp_path / "runs" / "detect" / name


def test_one_fg_continues_a_job_stopped_for_terminal_output_and_the_time_stopped_counts_once(cli, tiny_data, tmp_path):
    """It took 29 fg's: the thread relaying the trainer's output kept raising SIGTTOU, one stop per try, and the
    time stopped was counted each time ("done: 30 epochs in 0.0 s")."""
    shell, run = start_job(cli, tiny_data, tmp_path, "bg", epochs=3, background=True)
    try:
        supervisor = supervisor_of(cli)
        wait_for(lambda: all_stopped(supervisor), 120, "the job and its whole tree stopped for terminal output")
        assert not training(run)  # stopped at its first line: it did not train unwatched
        stopped_at = time.time()
        time.sleep(3)
        assert all_stopped(supervisor)  # it stays stopped while in the background
        shell.type("fg\n")  # once
        wait_for(lambda: RunPaths(run).results.exists(), 240, "an epoch trained after one fg")
        assert supervisor.status() not in STOPPED
        wait_for(lambda: events(run, "finished"), 240, "the run's end")
    finally:
        shell.type("exit\n")
        time.sleep(1)
        shell.close()
    assert epochs_in(run) == [1, 2, 3]
    (started,), (finished,) = events(run, "started"), events(run, "finished")
    assert finished["exit_code"] == 0
    said = float(re.search(r"done: 3 epochs in ([\d.]+) s", RunPaths(run).log.read_text())[1])
    stopped = min(stopped_at + 3, finished["time"]) - started["time"]  # at least the 3 s it was seen stopped
    assert 0 < said <= finished["time"] - started["time"] - 3 + 1.5, (said, stopped)  # counted once: not 0
    suspended = events(run, "suspended")
    assert len(suspended) == 1 and suspended[0]["signal"] == "SIGTTOU", suspended
    assert cli.leftovers() == []


@pytest.mark.parametrize("how", ["tty output", "ctrl-z"])
def test_a_stopped_job_whose_terminal_goes_away_ends_with_sighup(cli, tiny_data, tmp_path, how):
    """The terminal closed on a job stopped for terminal output: its tree stayed stopped for good (four processes in
    state T, with no one left to continue them). Stopped by Ctrl-Z, or for terminal output: the hang-up ends it."""
    shell, run = start_job(cli, tiny_data, tmp_path, "hup", epochs=50, background=how == "tty output")
    try:
        supervisor = supervisor_of(cli)
        if how == "ctrl-z":
            wait_for(lambda: training(run), 240, "training")
            shell.type("\x1a")  # Ctrl-Z: the terminal sends SIGTSTP to its foreground job
        wait_for(lambda: all_stopped(supervisor), 120, "the job and its whole tree stopped")
        pids = [p.pid for p in tree(supervisor)]
    finally:
        shell.close()  # the window closed
    wait_for(lambda: not any(psutil.pid_exists(pid) and _alive(pid) for pid in pids), 120, "the whole tree gone")
    [stopped] = events(run, "stopped")
    assert stopped["exit_code"] == errors.HANGUP, stopped
    assert [e["signal"] for e in events(run, "interrupted")] == ["SIGHUP"]
    assert cli.leftovers() == []
    shell.proc.wait(timeout=30)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_shell_survives_its_job(cli):
    """The harness itself: a shell in a terminal runs a command and exits, leaving nothing."""
    shell = Shell(os.getcwd(), cli.environ())
    shell.type("echo $((6*7))\nexit\n")
    shell.proc.wait(timeout=30)
    shell.close()
    assert "42" in shell.output() and shell.proc.returncode == 0
