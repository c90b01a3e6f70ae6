"""tests/cost.py: make test's closing line sums each test's seconds by kind, a launch's apart, over the workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = '''
import subprocess, sys, time

import pytest

@pytest.mark.own_launch("the launch is what is measured")
def test_a_launch():  # a child whose command names torchrun: counted as a launch, while it sleeps
    subprocess.run([sys.executable, "-c", "import time; time.sleep(1.5)", "torchrun"], check=True)

def test_some_work():  # a child that is no launch, and this process's own CPU
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    start = time.process_time()
    while time.process_time() - start < 0.5:
        pass
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_the_summary_counts_launches_apart_from_the_rest(tmp_path, workers):
    (tmp_path / "test_inner.py").write_text(TESTS)
    figures = tmp_path / "cost.json"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cost", "-p", "no:cacheprovider", *workers,
                          str(tmp_path / "test_inner.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "TRNLAB_COST_JSON": str(figures)})
    assert run.returncode == 0, run.stdout[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("cost: "))
    found = {kind: (float(wall), float(cpu)) for kind, wall, cpu in
             re.findall(r"(\w+) (-?\d+) s \((-?\d+) CPU-s\)", line)}
    assert list(found) == ["launches", "notebooks", "browser", "rest"]
    assert found["launches"][0] >= 1 and found["launches"][1] <= 1  # it slept: wall, hardly any CPU
    assert found["notebooks"] == found["browser"] == (0, 0) and found["rest"][1] >= 0
    by_file = json.loads(figures.read_text())["by_file"]
    [(name, (wall, cpu))] = by_file.items()
    assert name.endswith("test_inner.py")
    assert wall >= 1.5 and cpu >= 0.5  # both tests, the launch included


SHARING = '''
import subprocess, sys

import pytest

def launch():  # a child whose command names torchrun: a launch
    subprocess.run([sys.executable, "-c", "pass", "torchrun"], check=True)

@pytest.fixture(scope="module")
def shared():
    launch()

@pytest.fixture
def per_test():
    launch()

def test_reads_the_shared_launch(shared):
    pass

def test_reads_it_too(shared):
    pass

def test_launches_in_its_body():
    launch()

def test_launches_in_a_function_fixture(per_test):
    pass

@pytest.mark.own_launch("its point is its own launch")
def test_marked():
    launch()
'''


def test_a_launch_that_no_shared_fixture_starts_fails_its_test_unless_marked(tmp_path):
    (tmp_path / "test_inner.py").write_text(SHARING)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cost", "-p", "no:cacheprovider", "-rfE", "-q",
                          str(tmp_path / "test_inner.py")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1, run.stdout[-3000:]
    failed = sorted(re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)", run.stdout, re.M))
    assert failed == ["test_launches_in_a_function_fixture", "test_launches_in_its_body"], run.stdout[-3000:]
    assert "started 1 launch(es) of its own in its call: " in run.stdout
    assert "started 1 launch(es) of its own in its setup: " in run.stdout
    assert "mark it @pytest.mark.own_launch" in run.stdout and "3 passed" in run.stdout
