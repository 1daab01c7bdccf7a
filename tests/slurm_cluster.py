"""A real SLURM cluster of two nodes on this machine, thrown away after the test: ../shared/DESIGN.md's recipe.

Debian's slurm-wlm with munge: one ``munged`` with a key and a socket of its own, one ``slurmctld`` and two
``slurmd`` (``-N n1``, ``-N n2``) on 127.0.0.1 with ports of their own, ``proctrack/linuxproc`` and
``task/none``; the key, ``slurm.conf``, state, spool and logs in one temporary directory. Each daemon runs in
the foreground as a child of the test, and :meth:`Cluster.stop` ends them, the jobs and whatever the cluster
started (a process whose command line or environment names the directory: ``slurmstepd`` and the jobs carry
``SLURM_CONF``), then says what it could not end. The machine's own SLURM and munge, if any, are not touched.

The node names must resolve: rocm-yolo meets at the job's first host, ``n1``. Where ``n1`` and ``n2`` do not
resolve, the cluster adds ``127.0.0.1 n1 n2`` to /etc/hosts for its life (marked, and removed by
:meth:`Cluster.stop`); where either resolves elsewhere, :func:`unavailable` says so and the tests skip.

What CI installs for it (Debian 12: 8 packages, 16 s from an empty apt cache here)::

    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        slurmctld slurmd slurm-client munge
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

NODES = ("n1", "n2")
COMMANDS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue", "scontrol", "sinfo")
HOSTS = Path("/etc/hosts")
HOSTS_MARK = "# rocm-yolo tests/slurm_cluster.py"
KILL_WAIT = 30  # scancel: SIGTERM to every process of the job's steps, SIGKILL 30 s later (SLURM's default)
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL")


def which(name: str) -> str | None:
    """``name`` on PATH, or in /usr/sbin and /sbin (where Debian puts the daemons)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _address(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def unavailable() -> str | None:
    """Why a cluster cannot start here (one line), or None."""
    missing = [name for name in COMMANDS if which(name) is None]
    if missing:
        return f"no SLURM here ({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client munge"
    if os.geteuid() != 0:
        return "a SLURM cluster of the test's own needs root (slurmd starts the tasks, /etc/hosts names the nodes)"
    elsewhere = [f"{n} is {a}" for n in NODES if (a := _address(n)) not in (None, "127.0.0.1")]
    if elsewhere:
        return f"the test's node names resolve to other machines here ({', '.join(elsewhere)})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """munged, slurmctld and the two slurmd of one temporary directory, and the commands that talk to them."""

    def __init__(self, first_job_id: int = 1):
        self.root = Path(tempfile.mkdtemp(prefix="ry-slurm-"))  # short: munge's socket path has a limit
        self.root.chmod(0o755)  # munged wants its socket's directories searchable by all
        self.conf = self.root / "slurm.conf"
        self.first_job_id = first_job_id
        self.daemons: dict[str, subprocess.Popen] = {}  # munged, slurmctld, slurmd-n1, slurmd-n2
        self.added_hosts = False

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (else this process's environment) with this cluster's ``SLURM_CONF``."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 30) -> str:
        """A SLURM client command against this cluster: its output (CalledProcessError if it fails)."""
        return subprocess.run(
            args, env=self.environ(), capture_output=True, text=True, timeout=timeout, check=True
        ).stdout

    # --- start and stop

    def start(self, timeout: float = 60) -> None:
        self._name_nodes()
        (self.root / "state").mkdir()
        for node in NODES:
            (self.root / "spool" / node).mkdir(parents=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(self._slurm_conf())
        self._daemon(
            "munged",
            "-F",
            f"--key-file={key}",
            f"--socket={self.root / 'munge.socket'}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--seed-file={self.root / 'munged.seed'}",
        )
        self._until(lambda: (self.root / "munge.socket").exists(), timeout, "munged's socket")
        self._daemon("slurmctld", "-D", "-f", str(self.conf))
        for node in NODES:
            self._daemon("slurmd", "-D", "-N", node, "-f", str(self.conf), name=f"slurmd-{node}")
        self._until(self._nodes_idle, timeout, f"nodes {', '.join(NODES)} idle")

    def stop(self, grace: float = 10) -> list[psutil.Process]:
        """Cancel every job, end the daemons and whatever the cluster started, put /etc/hosts back, remove the
        directory: the processes still there after all of it (none, unless something refused to die)."""
        controller = self.daemons.get("slurmctld")
        if controller is not None and controller.poll() is None:
            try:
                self.command("scancel", "--user", "root")
                self._until(lambda: not self.command("squeue", "-h").strip(), KILL_WAIT + 15, "", fail=False)
            except (OSError, subprocess.SubprocessError):
                pass
        for proc in reversed(self.daemons.values()):  # the slurmd, slurmctld, then munged
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        strays = self.processes()
        for proc in strays:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(strays, timeout=grace)
        self._unname_nodes()
        left = [p for p in self.processes() if p.is_running()]
        if not left:
            shutil.rmtree(self.root, ignore_errors=True)
        return left

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster: its daemons, their ``slurmstepd``, the jobs' processes (they carry
        ``SLURM_CONF``): whatever names the cluster's directory in its command line or environment."""
        found, mark = [], str(self.root)
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            try:
                if any(mark in x for x in proc.cmdline()) or any(mark in v for v in proc.environ().values()):
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def log(self, lines: int = 40) -> str:
        """The end of every daemon's log, for a failure's message."""
        return "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for path in sorted([*self.root.glob("*.out"), *self.root.glob("*.log")])
        )

    # --- jobs

    def sbatch(self, script: Path, env: dict[str, str], cwd: Path) -> int:
        """Submit ``script`` with ``env`` (its tasks inherit it), its output in ``cwd/slurm-JOB.out``: the job id."""
        out = subprocess.run(
            ["sbatch", "--parsable", f"--chdir={cwd}", f"--output={cwd}/slurm-%j.out", str(script)],
            env=self.environ(env),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, f"sbatch failed: {out.stderr}\n{self.log()}"
        return int(out.stdout.strip().split(";")[0])

    def job(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, NodeList, ...): SLURM's account of the job, kept for
        MinJobAge (300 s) after it ends."""
        text = self.command("scontrol", "-o", "show", "job", str(job))
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def wait(self, job: int, timeout: float) -> dict[str, str]:
        """Wait until the job has ended: its fields then (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job))["JobState"] not in ENDED:
            assert time.monotonic() < deadline, f"job {job} still {fields['JobState']} after {timeout} s"
            time.sleep(0.5)
        return fields

    # --- inside

    def _daemon(self, program: str, *args: str, name: str = "") -> None:
        name = name or program
        with open(self.root / f"{name}.out", "w") as out:  # what it says before its log file is open
            self.daemons[name] = subprocess.Popen(
                [which(program), *args], env=self.environ(), stdout=out, stderr=subprocess.STDOUT, cwd=self.root
            )

    def _nodes_idle(self) -> bool:
        dead = [name for name, proc in self.daemons.items() if proc.poll() is not None]
        assert not dead, f"{', '.join(dead)} ended at start:\n{self.log()}"
        try:
            states = dict(line.split() for line in self.command("sinfo", "-h", "-N", "-o", "%N %t").splitlines())
        except subprocess.SubprocessError:
            return False
        return all(states.get(node) == "idle" for node in NODES)

    def _until(self, predicate, timeout: float, what: str, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                assert not fail, f"SLURM: no {what} after {timeout} s:\n{self.log()}"
                return
            time.sleep(0.2)

    def _slurm_conf(self) -> str:
        root = self.root
        nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={os.cpu_count()}" for n in NODES)
        return f"""\
ClusterName=rocmyolotest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/linear
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg={shutil.which("true")}
ReturnToService=2
KillWait={KILL_WAIT}
FirstJobId={self.first_job_id}
{nodes}
PartitionName=test Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""

    def _name_nodes(self) -> None:
        text = HOSTS.read_text()
        self.added_hosts = HOSTS_MARK in text  # a line of a cluster killed before its stop goes with this one's
        missing = [n for n in NODES if _address(n) is None]
        if missing:
            line = f"127.0.0.1 {' '.join(missing)} {HOSTS_MARK}\n"
            with open(HOSTS, "a") as f:
                f.write(("\n" if text and not text.endswith("\n") else "") + line)
            self.added_hosts = True

    def _unname_nodes(self) -> None:
        if not self.added_hosts:
            return
        kept = [line for line in HOSTS.read_text().splitlines(keepends=True) if not line.rstrip().endswith(HOSTS_MARK)]
        with open(HOSTS, "r+") as f:  # in place: /etc/hosts may be a mount
            f.write("".join(kept))
            f.truncate()
        self.added_hosts = False
