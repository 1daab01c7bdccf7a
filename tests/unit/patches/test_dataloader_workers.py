"""The DataLoader patch keeps torch's contract with real fork-server workers (issue 27, items 1-6).

Each test builds loaders as a user's code would, with the patch installed and the preloaded fork
server started as the training child starts them (this test process stands in for the trainer).
Where a test follows one of torch's own (test/test_dataloader.py), its docstring names it.
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import textwrap

import loader_cases
import pytest
import torch
from torch.utils.data import DataLoader

from rocm_yolo.patches.loaders import dataloader as patch
from rocm_yolo.patches.loaders import worker_deaths
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.run.paths import RunPaths
from rocm_yolo.trainer.forkserver import server as forkserver

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A fork server started as the trainer starts it, under profile ``fast`` (persistent workers, no timeout)."""
    run = tmp_path_factory.mktemp("run")
    os.environ["LOADER_IMPORTS_LOG"] = str(run / "imports.log")  # the server and its workers inherit it
    multiprocessing.forkserver._forkserver._stop()  # a server an earlier test of this process started
    forkserver.start(run)
    patch.install(resolve("fast", 2, cpu_count=4).loader, run)
    yield run
    patch.uninstall()
    multiprocessing.forkserver._forkserver._stop()
    os.environ.pop("LOADER_IMPORTS_LOG", None)
    assert not worker_deaths.installed()


def test_timeout_the_caller_passed_wins_over_the_profiles(trainer):
    """Follows torch's test_timeout: a 1 s timeout over an item that takes 4 s raises, patched too (the workers
    then finish that item before they stop)."""
    loader = DataLoader(loader_cases.Sleepy(4), num_workers=2, timeout=1)
    assert loader.timeout == 1  # fast's own is 0: wait for ever
    with pytest.raises(RuntimeError):
        next(iter(loader))


def test_a_worker_killed_by_a_signal_is_named_with_its_pid_and_signal(trainer):
    """Follows torch's test_segfault: the error's cause names the worker and the signal, as torch's SIGCHLD handler
    does for its own children (a fork-server worker is the server's child: no SIGCHLD reaches the trainer)."""
    for how, signum in (("segfault", signal.SIGSEGV), (int(signal.SIGKILL), signal.SIGKILL)):
        iterator = iter(DataLoader(loader_cases.Crash(how), batch_size=2, num_workers=2))
        pids = {w.pid for w in iterator._workers}
        with pytest.raises(RuntimeError) as raised:
            for _ in iterator:
                pass
        cause = str(raised.value.__cause__)
        assert any(f"(pid {pid})" in cause for pid in pids), cause
        assert signal.strsignal(signum) in cause, cause


def test_workers_are_fresh_every_epoch_unless_the_caller_asked_to_keep_them(trainer, tmp_path):
    """Follows torch's test_dataset_not_reset and test_worker_seed_reproducibility (the non-persistent side):
    under a profile that keeps its own workers, a user's loader still sees the dataset as changed between
    epochs, repeats an epoch's worker seeds after torch.manual_seed, and runs worker_init_fn every epoch."""
    dataset = loader_cases.Logged(str(tmp_path / "inits.log"))
    loader = DataLoader(dataset, batch_size=4, num_workers=2, worker_init_fn=loader_cases.record_init)
    seen = []
    for epoch in range(3):
        dataset.start = 100 * epoch
        seen.append(sorted(x for batch in loader for x in batch.tolist()))
    assert seen == [[100 * e + i for i in range(8)] for e in range(3)]
    assert len((tmp_path / "inits.log").read_text().splitlines()) == 3 * 2  # each worker, each epoch

    seeds = DataLoader(loader_cases.WorkerSeed(), num_workers=2)
    epochs = []
    for _ in range(2):
        torch.manual_seed(7)
        epochs.append(sorted({int(x) for x in seeds}))
    assert epochs[0] == epochs[1] and len(epochs[0]) == 2


def test_a_local_dataset_or_function_is_refused_in_one_line_before_any_worker_starts(trainer):
    def init(worker_id):
        pass

    class Local(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    for kwargs, named in (
        ({"dataset": loader_cases.Offset(), "worker_init_fn": init}, "worker_init_fn"),
        ({"dataset": Local()}, "dataset"),
        ({"dataset": loader_cases.Offset(), "collate_fn": lambda batch: batch}, "collate_fn"),
    ):
        with pytest.raises(patch.LoaderArgumentError) as raised:
            DataLoader(num_workers=2, **kwargs)
        line = str(raised.value)
        assert "\n" not in line and named in line and "top level of a module" in line
    assert isinstance(raised.value, ValueError)
    DataLoader(loader_cases.Offset(), num_workers=2, worker_init_fn=init, multiprocessing_context="fork")  # fork: fine


def test_the_fork_server_imports_a_datasets_module_once_not_in_every_worker(trainer):
    """Follows the cost torch's test_iterable_style_dataset and test_ind_worker_queue showed: a module import per
    worker."""
    import loader_heavy_import

    log = trainer / "imports.log"
    for _ in range(3):
        loader = DataLoader(loader_heavy_import.Numbers(), batch_size=2, num_workers=2)
        assert sorted(x for b in loader for x in b.tolist()) == list(range(8))
    server = json.loads(RunPaths(trainer).forkserver().read_text())["pid"]
    importers = [int(x) for x in log.read_text().split()]
    workers = {json.loads(x)["pid"] for x in RunPaths(trainer).workers.read_text().splitlines()}
    # this process, the server's trial import in a fork of itself, then the server: none of the 6 workers
    assert len(importers) == 3 and importers[0] == os.getpid() and importers[2] == server, importers
    assert not workers & set(importers) and len(workers) >= 6
    # the names came from this process over a pipe: no file in the run's folder says what the server imports
    assert not [p for p in RunPaths(trainer).node_dir.iterdir() if "import" in p.name]


def test_a_module_list_planted_in_the_runs_folder_is_never_imported_by_the_fork_server(trainer, tmp_path):
    """What rocm-yolo once read from RUN/rocm_yolo/forkserver-imports.txt (a module and a sys.path for it), planted
    by a stranger: the server takes its names from the trainer's pipe alone, so the stranger's module never runs in
    it nor in any worker."""
    stranger = tmp_path / "elsewhere"
    stranger.mkdir()
    marker = tmp_path / "ran"
    (stranger / "strangers_module.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n")
    line = json.dumps({"module": "strangers_module", "sys_path": [str(stranger)]}) + "\n"
    paths = RunPaths(trainer)
    for planted in (paths.node_dir / "forkserver-imports.txt", paths.node_dir / "forkserver-imports-rank1.txt"):
        with open(planted, "a") as f:  # added after what the trainer named so far, as a stranger would
            f.write(line)
    try:
        loader = DataLoader(loader_cases.Offset(), batch_size=2, num_workers=2)
        assert len(list(loader)) > 0  # the server forked its workers, looking for new names before each fork
        assert not marker.exists()
    finally:
        for planted in paths.node_dir.glob("forkserver-imports*"):
            planted.unlink()


SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import torch
from torch.utils.data import DataLoader, TensorDataset
from rocm_yolo.patches.loaders import dataloader as patch
from rocm_yolo.policy.profiles import resolve
from rocm_yolo.trainer.forkserver import server as forkserver

def main():
    forkserver.start({run!r})
    patch.install(resolve("fast", 2, cpu_count=4).loader, {run!r})
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=2)
    print("sum", sum(int(x) for b in loader for x in b[0]))
{call}
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_a_main_guard_is_refused_in_one_line(tmp_path, guarded):
    call = 'if __name__ == "__main__":\n    main()' if guarded else "main()"
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(here=HERE, run=str(tmp_path / "run"), call=call)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    if guarded:
        assert done.returncode == 0 and "sum 28" in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "sum" not in done.stdout
        last = done.stderr.strip().splitlines()[-1]
        assert "LoaderArgumentError" in last and f"{script}:" in last and "__name__" in last, done.stderr[-2000:]


def test_a_module_that_touches_the_gpu_or_starts_a_thread_is_left_to_the_workers(trainer):
    """The fork server must stay without GPU state and threads: a trial import in a fork of it decides."""
    import loader_thread_import

    loader = DataLoader(loader_thread_import.Numbers(), batch_size=2, num_workers=2)
    assert sorted(x for b in loader for x in b.tolist()) == list(range(8))
    log = [int(x) for x in (trainer / "thread-imports.log").read_text().split()]
    server = json.loads(RunPaths(trainer).forkserver().read_text())["pid"]
    assert server not in log and len(log) >= 3  # this process, the trial, and each worker itself
