"""End to end in a real Jupyter kernel, driven by nbclient (issue 31): ``rocm_yolo.train`` in a notebook.

One kernel for every check, as a user's notebook has: a missing model is one line in the cell; a training run's
lines (the child's stderr, copied, and the supervisor's own) reach the cell, not the kernel's terminal; the kernel's
interrupt stops the whole training tree, then raises KeyboardInterrupt in the cell, so the rest of the cell and the
cells queued behind it ("Run All") do not run; the resume advice is a Python call, and running it finishes the run.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers import TAG_VAR, epochs_in
from rocm_yolo.process.lifecycle import alive
from rocm_yolo.process.tagged import Tagged
from rocm_yolo.run.paths import RunPaths

TINY = "device='cpu', imgsz=32, batch=4, plots=False, workers=0"  # helpers.TINY, as keywords


def stderr_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr")


def stdout_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


def error_of(cell) -> dict:
    found = [o for o in cell.outputs if o.output_type == "error"]
    return found[0] if found else {}


class Notebook:
    """A notebook whose cells are added and run one at a time, in one kernel."""

    def __init__(self, cwd: Path, tagged: Tagged):
        self.nb = nbformat.v4.new_notebook()
        self.client = NotebookClient(
            self.nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(cwd)}}
        )  # errors stop the queued cells, as "Run All" in Jupyter (stop_on_error), and fail the test unless expected
        # as in Jupyter: ipykernel does not point fd 2 at the cell under pytest
        self.env = {k: v for k, v in tagged.environ().items() if k != "PYTEST_CURRENT_TEST"}

    def add(self, code: str, raises: bool = False):
        tags = ["raises-exception"] if raises else []  # expected: its error is in its outputs
        self.nb.cells.append(nbformat.v4.new_code_cell(code, metadata={"tags": tags}))
        return len(self.nb.cells) - 1

    async def run(self, code: str, raises: bool = False):
        index = self.add(code, raises)
        await self.client.async_execute_cell(self.nb.cells[index], index)
        return self.nb.cells[index]


async def interrupted_training(book: Notebook, data: Path, run: Path):
    """Train, and once the first epoch is saved: queue a cell behind the training one ("Run All"), then interrupt."""
    train = f"rocm_yolo.train({str(data)!r}, epochs=3, name='nb', model='yolo26n.yaml', {TINY})"
    index = book.add(f"import rocm_yolo\n{train}\nprint('after')")  # no raises-exception tag: stop_on_error
    cell = book.nb.cells[index]
    training = asyncio.ensure_future(book.client.async_execute_cell(cell, index))
    deadline = time.monotonic() + 240
    while not RunPaths(run).last.exists():
        assert not training.done() and time.monotonic() < deadline, stderr_of(cell)[-3000:]
        await asyncio.sleep(0.1)
    book.client.kc.execute("ran_on = True")  # queued behind the training cell
    await book.client.km.interrupt_kernel()
    with pytest.raises(CellExecutionError) as caught:
        await asyncio.wait_for(training, 120)
    assert caught.value.ename == "KeyboardInterrupt", str(caught.value)[-3000:]
    return cell


async def session(tmp_path: Path, data: Path, tagged: Tagged) -> None:
    book = Notebook(tmp_path, tagged)
    run = tmp_path / "runs" / "detect" / "nb"
    async with book.client.async_setup_kernel(env=book.env):
        kernel = int((await book.run("import os\nprint(os.getpid())")).outputs[0]["text"])

        bad = await book.run(f"import rocm_yolo\nrocm_yolo.train({str(data)!r}, model='/nope.pt', {TINY})", True)
        assert error_of(bad).get("ename") == "UsageError" and "model='/nope.pt': no such file" in error_of(bad).evalue

        cell = await interrupted_training(book, data, run)
        shown = stderr_of(cell)
        assert error_of(cell).get("ename") == "KeyboardInterrupt", cell.outputs
        assert "after" not in stdout_of(cell)  # the rest of the cell did not run
        # the child's lines (its header, its loaders), then the supervisor's, in the cell
        assert "rocm-yolo: rocm-yolo " in shown and "| profile fast |" in shown, shown[-3000:]
        assert "rocm-yolo: train loader: workers=" in shown, shown[-3000:]
        assert "stopped by SIGINT; the training process tree is gone" in shown, shown[-3000:]
        left = [p.pid for p in tagged.processes() if p.pid != kernel and alive(p.pid)]
        assert left == []  # the tree was gone when the cell raised: only the kernel is left

        queued = await book.run("print('ran_on' in globals())")
        assert stdout_of(queued).strip() == "False"  # the cell queued behind it did not run either

        advice = re.findall(r"resume with: (rocm_yolo\.train\(.*\))", shown)
        assert advice == [f"rocm_yolo.train(resume={str(RunPaths(run).last)!r})"], shown[-3000:]
        resumed = await book.run(f"result = {advice[0]}\nprint(result.state.value, result.exit_code)")
        assert stdout_of(resumed).splitlines()[-1] == "finished 0", stderr_of(resumed)[-3000:]
        assert "rocm-yolo: resuming " in stderr_of(resumed), stderr_of(resumed)[-3000:]
    assert epochs_in(run) == [1, 2, 3]


def test_in_a_notebook_the_cell_shows_rocm_yolo_an_interrupt_raises_and_the_advice_resumes(tiny_data, tmp_path):
    tagged = Tagged(TAG_VAR)
    try:
        asyncio.run(session(tmp_path, tiny_data, tagged))
        assert tagged.leftovers() == []  # the kernel too, once shut down
    finally:
        tagged.kill(wait=0)
