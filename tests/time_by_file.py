"""``--time-by-file``: where the suite's time goes, per test file: its wall time and the CPU its processes used.

``python -m pytest -q --time-by-file`` ends with a table of the files, most CPU first. The wall time is pytest's
own (setup, call and teardown, summed over the xdist workers); the CPU is the test process's own plus that of every
process it started and waited for, and their children waited for in turn (``RUSAGE_CHILDREN``): a process left to
init (a fork server that dies with its trainer) is not counted. On 2 cores the suite is CPU-bound, so a file's CPU
is what it costs the others; its wall time beyond its CPU is time spent waiting (a stall timeout, a sleep).
"""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

CPU = "cpu_seconds"  # the user property a test's teardown report carries to the xdist controller
_START = pytest.StashKey[float]()  # the CPU seconds when the test's setup began


def pytest_addoption(parser):
    parser.addoption("--time-by-file", action="store_true", help="end with each test file's wall and CPU seconds")


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.config.getoption("time_by_file"):
        item.stash[_START] = _cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        outcome.get_result().user_properties.append((CPU, round(_cpu() - item.stash[_START], 3)))


class Totals:
    """The controller's sums per file (in an xdist run the reports come from the workers)."""

    def __init__(self):
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        self.wall[path] += report.duration
        for key, value in report.user_properties:
            if key == CPU:
                self.cpu[path] += value
                self.tests[path] += 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        tr.section("time by file (wall: setup + call + teardown; CPU: the test's processes)")
        tr.write_line(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file")
        rows = [(self.cpu[p], self.wall[p], self.tests[p], p) for p in self.wall]
        rows.sort(key=lambda row: (-row[0], -row[1]))
        rows.append((sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] for r in rows), "all"))
        for cpu, wall, tests, path in rows:
            tr.write_line(f"{cpu:8.1f} {wall:8.1f} {tests:6d}  {path}")


def pytest_configure(config):
    if config.getoption("time_by_file") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Totals(), "time-by-file-totals")
