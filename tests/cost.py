"""What ``make test`` costs (``-p tests.cost``): each test's wall and CPU seconds, its own process's and its children's
(torchrun and its ranks, notebook kernels, the browser), summed by kind and by file at the end of the session.

It also keeps the launches' cost from creeping back: a launch started by a test itself, or by a function-scoped
fixture, fails that test unless the test is marked ``own_launch("why")`` (its point is its own launch: a rank
killed, a bad flag refused). Every other launch belongs in a session or module fixture, which its readers share."""

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
#: A launch: torchrun, python -m trnlab launch, tools/launch_cost.py or a batch script (each runs torchrun).
LAUNCH = re.compile(r"torch\.distributed\.run|torchrun|trnlab\W+launch|launch_cost|\.sbatch")
_KEY = "trnlab-cost"
_MARK = pytest.StashKey[tuple]()
_UNSHARED: list[str] = []  # the launches the running test phase started outside a shared fixture
_SCOPES: list[str] = []  # "shared" or "function": each fixture being set up, innermost last


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
    _UNSHARED.clear()  # a launch between tests (collection, a module's import) is no test's own


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries its wall and CPU seconds and its launches' (xdist sends it to the controller)."""
    outcome = yield
    now = (time.monotonic(), cpu_seconds())
    then = item.stash.get(_MARK, now)
    item.stash[_MARK] = now
    launched = [sum(wall for wall, _ in LAUNCHES), sum(cpu for _, cpu in LAUNCHES)]
    LAUNCHES.clear()
    report = outcome.get_result()
    report.user_properties.append((_KEY, [now[0] - then[0], now[1] - then[1], *launched]))
    unshared, _UNSHARED[:] = list(_UNSHARED), []  # a shared fixture's teardown runs in some test's: not counted
    if unshared and call.when != "teardown" and item.get_closest_marker("own_launch") is None \
            and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started {len(unshared)} launch(es) of its own in its {call.when}: "
                           + "; ".join(unshared) + ". Start it in a session or module fixture that every test reading "
                           "it shares (tests.cost keeps the suite's launch cost from creeping back), or, if the "
                           "test's point is its own launch, mark it @pytest.mark.own_launch(\"why\")")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Launches started while a session, package, module or class fixture is set up are shared (a class fixture
    of a test outside a class is set up for each test: not shared)."""
    shared = fixturedef.scope != "function" and (fixturedef.scope != "class" or request.node.getparent(pytest.Class))
    _SCOPES.append("shared" if shared else "function")
    try:
        yield
    finally:
        _SCOPES.pop()


_running: list[tuple[float, float]] = []  # when each launch still running started (wall, cpu)


class _Popen(subprocess.Popen):
    """``subprocess.Popen`` that adds to :data:`LAUNCHES` the seconds from the first of the launches running at once
    to the exit of the last (the CPU seconds of every child this process waited for meanwhile: one test at a time)."""

    def __init__(self, args, *rest, **options):
        self._launch = LAUNCH.search(str(args)) is not None
        if self._launch:
            _running.append((time.monotonic(), cpu_seconds()))
            if not _SCOPES or _SCOPES[-1] != "shared":  # the innermost fixture being set up, if any
                _UNSHARED.append(" ".join(map(str, args if isinstance(args, (list, tuple)) else [args]))[:200])
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
