"""What ``make test`` costs (``-p tests.cost``): each test's wall and CPU seconds, its own process's and its children's
(torchrun and its ranks, notebook kernels, the browser), summed by kind and by file at the end of the session."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import time
from collections import defaultdict

import pytest

#: Seconds the running test spent in launches: ``[(wall, cpu), ...]``, one a launch, from start to exit.
LAUNCHES: list[tuple[float, float]] = []
#: A launch: torchrun, python -m trnlab launch, or a batch script (that runs torchrun), as the tests start them.
LAUNCH = re.compile(r"torch\.distributed\.run|torchrun|trnlab\W+launch|\.sbatch")
_KEY = "trnlab-cost"
_MARK = pytest.StashKey[tuple]()


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of every child it waited for (theirs included)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def kind(nodeid: str) -> str:
    """A test's kind in the summary: ``notebooks``, ``browser`` or ``rest`` (its launches are counted apart)."""
    if nodeid.startswith("notebooks/"):
        return "notebooks"
    return "browser" if nodeid.startswith("tests/browser/") else "rest"


def pytest_runtest_setup(item):
    """The clock starts with the test's setup: module fixtures set up there are the first test's cost."""
    item.stash[_MARK] = (time.monotonic(), cpu_seconds())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries its wall and CPU seconds and its launches' (xdist sends it to the controller)."""
    outcome = yield
    now = (time.monotonic(), cpu_seconds())
    then = item.stash.get(_MARK, now)
    item.stash[_MARK] = now
    launched = [sum(wall for wall, _ in LAUNCHES), sum(cpu for _, cpu in LAUNCHES)]
    LAUNCHES.clear()
    outcome.get_result().user_properties.append((_KEY, [now[0] - then[0], now[1] - then[1], *launched]))


_running: list[tuple[float, float]] = []  # when each launch still running started (wall, cpu)


class _Popen(subprocess.Popen):
    """``subprocess.Popen`` that adds to :data:`LAUNCHES` the seconds from the first of the launches running at once
    to the exit of the last (the CPU seconds of every child this process waited for meanwhile: one test at a time)."""

    def __init__(self, args, *rest, **options):
        self._launch = LAUNCH.search(str(args)) is not None
        if self._launch:
            _running.append((time.monotonic(), cpu_seconds()))
        super().__init__(args, *rest, **options)

    def _ended(self):
        if self.returncode is not None and self._launch:
            self._launch = False
            started = _running.pop()
            if not _running:
                LAUNCHES.append((time.monotonic() - started[0], cpu_seconds() - started[1]))
            else:
                _running[0] = min(_running[0], started)

    def wait(self, timeout=None):
        try:
            return super().wait(timeout)
        finally:
            self._ended()

    def poll(self):
        try:
            return super().poll()
        finally:
            self._ended()


class _Totals:
    """The controller's sums: ``[wall, cpu]`` by test file and by kind (launches, notebooks, browser, rest)."""

    def __init__(self):
        self.by_file = defaultdict(lambda: [0.0, 0.0])
        self.by_kind = defaultdict(lambda: [0.0, 0.0])

    def pytest_runtest_logreport(self, report):
        for _, (wall, cpu, launch_wall, launch_cpu) in (p for p in report.user_properties if p[0] == _KEY):
            self.by_file[report.nodeid.split("::")[0]][0] += wall
            self.by_file[report.nodeid.split("::")[0]][1] += cpu
            self.by_kind[kind(report.nodeid)][0] += wall - launch_wall
            self.by_kind[kind(report.nodeid)][1] += cpu - launch_cpu
            self.by_kind["launches"][0] += launch_wall
            self.by_kind["launches"][1] += launch_cpu

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        if path := os.environ.get("TRNLAB_COST_JSON"):  # every file's figures, for the README's table
            with open(path, "w") as out:
                json.dump({"by_file": self.by_file, "by_kind": self.by_kind}, out, indent=1, sort_keys=True)
        kinds = ", ".join(f"{name} {self.by_kind[name][0]:.0f} s ({self.by_kind[name][1]:.0f} CPU-s)"
                          for name in ("launches", "notebooks", "browser", "rest"))
        terminalreporter.write_line(f"cost: {kinds}; each test's seconds, summed over the workers")


def pytest_configure(config):
    subprocess.Popen = _Popen  # subprocess.run and every test's Popen look the name up here
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_Totals(), "trnlab-cost-totals")
