"""End to end under a real SLURM: a cluster of two nodes on this machine (tests/slurm_cluster.py), the sbatch
script of docs/multi-gpu.md ("Under SLURM": ``srun rocm-yolo train $ARGS --device ...``, no node flags),
``scancel`` in the middle of training, then the same script submitted again, which resumes the run.

Each node's task trains on two CPU ranks through the DDP seam (tests/seams), as in test_e2e_multinode.py; no node
flag: rocm-yolo forms the job from ``SLURM_NNODES``, ``SLURM_NODEID`` and ``SLURM_JOB_NODELIST=n[1-2]`` as SLURM
sets them, and the rendezvous port is the run's own.
Marked ``multinode`` (``python -m pytest -q -m multinode tests/e2e/test_e2e_slurm.py``); it skips where slurm-wlm
and munge are not installed, or the tests do not run as root.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest

import slurm_cluster
from helpers import epochs_in, with_cpu_ranks
from rocm_yolo import errors
from rocm_yolo.request.demo import write_demo
from rocm_yolo.run import heartbeat
from rocm_yolo.run import weights as checkpoints
from rocm_yolo.run.nodes import read_round
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.run.spec import latest_spec
from rocm_yolo.run.supervisor_state import RunState, read_state

pytestmark = pytest.mark.multinode

# docs/multi-gpu.md's script, less what a CPU seam has no use for (GPUs, CPUs a task, a time limit, --requeue)
SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=yolo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
RUN={run}
if ls $RUN/weights/*.pt >/dev/null 2>&1; then
    ARGS="--resume $RUN"
else
    ARGS="{data} --model yolo26n.yaml --epochs 4 --batch 8 --imgsz 32 --workers 1 plots=False \\
          --project ${{RUN%/*}} --name ${{RUN##*/}}"
fi
srun {python} -m rocm_yolo train $ARGS --device 0,1
"""


def first_job_id() -> int:
    """A first job id for the cluster (the rendezvous port is the run's own, drawn at random: not the job's)."""
    return 1 + os.getpid() % 5000


@pytest.fixture
def slurm():
    reason = slurm_cluster.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = slurm_cluster.Cluster(first_job_id())
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
    assert left == [], f"left running after the cluster's end: {left}"


@pytest.fixture
def cli(cli):  # conftest's, which stops whatever a test left running
    return with_cpu_ranks(cli)


def task_ends(output: str) -> dict[int, str]:
    """What srun said of each task that did not exit 0 (``srun: error: n1: task 0: Exited with exit code 143``, or
    for several at once ``srun: error: n[1-2]: tasks 0-1: ...``)."""
    ends = {}
    for match in re.finditer(r"^srun: error: \S+: tasks? ([\d,-]+): (.+)$", output, re.M):
        for part in match[1].split(","):
            low, _, high = part.partition("-")
            ends.update(dict.fromkeys(range(int(low), int(high or low) + 1), match[2]))
    return ends


def test_scancel_stops_both_nodes_and_the_job_submitted_again_resumes_every_epoch_once(slurm, cli, tmp_path):
    data = write_demo(tmp_path / "data", train=32, val=8, size=64)  # batch 8 on 4 ranks: 4 batches an epoch
    run = tmp_path / "runs" / "yolo"
    script = tmp_path / "yolo.sbatch"
    script.write_text(SCRIPT.format(run=run, data=data, python=sys.executable))
    env = cli.environ()  # the test's tag goes with the job into every process it starts

    job = slurm.sbatch(script, env, tmp_path)
    output = tmp_path / f"slurm-{job}.out"
    deadline = time.monotonic() + 300  # until epoch 1 is saved: both nodes' first ranks are in epoch 2
    while not all(getattr(heartbeat.read(RunPaths(run, k).heartbeat), "epoch", 0) >= 2 for k in (0, 1)):
        fields = slurm.job(job)
        assert fields["JobState"] in ("PENDING", "RUNNING") and time.monotonic() < deadline, (
            f"no epoch 2 in job {job} ({fields['JobState']}):\n{output.read_text()[-3000:]}"
        )
        time.sleep(0.2)
    slurm.command("scancel", str(job))
    fields = slurm.wait(job, slurm_cluster.KILL_WAIT + 60)
    text = output.read_text(errors="replace")
    assert fields["JobState"] == "CANCELLED", fields
    # each supervisor stopped its node's tree on SIGTERM and exited 143 before SLURM's SIGKILL (KillWait)
    stopped = f"Exited with exit code {errors.TERMINATED}"
    assert task_ends(text) == {0: stopped, 1: stopped}, text[-3000:]
    assert text.count("rocm-yolo: stopped by SIGTERM; the training process tree is gone") == 2, text[-3000:]
    assert all(read_state(RunPaths(run, k)).state == RunState.INTERRUPTED for k in (0, 1))
    assert cli.leftovers() == [] and "Traceback" not in text
    weights = run / "weights"
    assert 1 <= len(epochs_in(run)) < 4 and checkpoints.verify(weights / "last.pt") is None
    # A stop lets a checkpoint write in progress end (trainer/callbacks/good_copy.py, midepoch/save.py): the
    # verified copy of epoch 1's last.pt, begun before epoch 2, is whole. Fails where the stop lands during that
    # copy: SLURM signals every process of the step, so torch's agent gets up to three SIGTERMs (SLURM's, and the
    # launcher forwards its own and the supervisor's), the later ones break its wait for its ranks, it exits, and
    # they die with it (PR_SET_PDEATHSIG, SIGKILL), the copy cut short.
    assert "was cut short" not in text and checkpoints.verify(weights / "last_good.pt") is None, text[-3000:]

    again = slurm.sbatch(script, env, tmp_path)  # the same script: weights are there, so --resume RUN
    fields = slurm.wait(again, 400)
    text = (tmp_path / f"slurm-{again}.out").read_text(errors="replace")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), text[-3000:]
    assert f"rocm-yolo: resuming {weights / 'last.pt'} from epoch " in text, text[-3000:]
    assert epochs_in(run) == [1, 2, 3, 4] and checkpoints.verify(weights / "last.pt") is None
    assert len(re.findall(r"^rocm-yolo: done: epochs? ", text, re.M)) == 2 and "Traceback" not in text
    for k in (0, 1):  # SLURM's variables formed the job on each node, and the node id is SLURM_NODEID
        nodes = latest_spec(run, k).nodes
        assert (nodes.count, nodes.node, nodes.source) == (2, k, "SLURM")
        assert nodes.endpoint == f"n1:{read_round(RunPaths(run, k)).port}"  # the run's own port, both jobs
        assert read_state(RunPaths(run, k)).state == RunState.FINISHED
    assert cli.leftovers() == []
