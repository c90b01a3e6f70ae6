"""trnlab.pytest_plugin: the course's nbval rules, run on notebooks outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from trnlab.pytest_plugin import notebook_problems, sanitize

REPO = Path(__file__).resolve().parent.parent

# Each run prints a new temporary path, a new address, a new timing and writes to stderr:
# nbval must still find the stored and the fresh outputs equal.
CHANGING_CELL = """# NBVAL_CHECK_OUTPUT
import sys, tempfile, time
import trnlab
start = time.perf_counter()
print("scratch folder:", tempfile.mkdtemp(prefix="learner-"))
print("model at", trnlab.model_name())
print(f"an object at {hex(id(object()))}, took {time.perf_counter() - start + 0.5:.3f} s")
print(f"device: {trnlab.pick_device('cpu', verbose=False)}")
print("warning: something noisy", file=sys.stderr, flush=True)
print("stable line", 6 * 7)"""


def _notebook(path: Path, sources: list[str], execute: bool = True) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    if execute:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return path


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "trnlab.pytest_plugin", "--nbval-lax",
                           "-p", "no:cacheprovider", "-q", *args, str(folder)],
                          cwd=folder, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def learner_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner-repo")  # outside this repository, like a learner's
    _notebook(folder / "good.ipynb", [CHANGING_CELL])
    # Stored without LEARNER_FLAG: the run with --notebook-env LEARNER_FLAG=on must differ.
    _notebook(folder / "flag.ipynb", ['# NBVAL_CHECK_OUTPUT\nimport os\nprint("flag:", os.environ.get("LEARNER_FLAG", "unset"))'])
    return folder


def test_a_learners_notebook_passes_with_paths_stderr_timings_and_addresses_changing(learner_folder):
    """One session: both notebooks as stored, and once more with --notebook-env LEARNER_FLAG=on."""
    stored = nbformat.read(learner_folder / "good.ipynb", as_version=4).cells[0].outputs
    assert any(o.get("name") == "stderr" for o in stored) and "/learner-" in stored[0]["text"]
    assert "LEARNER_FLAG" not in os.environ
    done = _pytest(learner_folder, "-rA", "--notebook-env", "LEARNER_FLAG=on")
    out = done.stdout
    assert "PASSED good.ipynb::Cell 0" in out and "PASSED good.ipynb::trnlab rules" in out, out
    assert "PASSED flag.ipynb::Cell 0" in out, out
    # The variable reached the second run's kernel, and only that one:
    assert "FAILED flag.ipynb[LEARNER_FLAG=on]::Cell 0" in out and "flag: on" in out, out
    # good.ipynb never names LEARNER_FLAG: its second run would repeat the first, so it is skipped.
    assert "SKIPPED [1] good.ipynb" in out and "good.ipynb never reads LEARNER_FLAG: run once more" in out, out
    assert "1 failed, 4 passed, 1 skipped" in out, out  # rules x2, good, flag as stored; once more is not ruled


def test_notebook_env_must_be_name_equals_value(learner_folder):
    from trnlab.pytest_plugin import parse_notebook_env

    assert parse_notebook_env("TRNLAB_DTYPE=bfloat16,A=") == {"TRNLAB_DTYPE": "bfloat16", "A": ""}
    with pytest.raises(pytest.UsageError, match="write NAME=VALUE"):
        parse_notebook_env("bfloat16")


def test_without_the_plugin_the_same_notebook_fails(learner_folder):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-q",
                           "-p", "no:cacheprovider", str(learner_folder / "good.ipynb")],
                          cwd=learner_folder, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "1 failed" in done.stdout  # so the plugin's sanitizing is what passes it


def _as_executed(path: Path) -> Path:
    """Give every code cell the execution count and output a run would (no kernel: the rules
    read only the stored notebook)."""
    nb = nbformat.read(path, as_version=4)
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        cell.execution_count = count
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nbformat.write(nb, path)
    return path


def test_broken_notebooks_fail_with_a_message_that_says_which_rule(tmp_path):
    _notebook(tmp_path / "unexecuted.ipynb", ["# NBVAL_CHECK_OUTPUT\nprint(1)"], execute=False)
    _as_executed(_notebook(tmp_path / "unchecked.ipynb", ["print(1)"], execute=False))
    _as_executed(_notebook(tmp_path / "error.ipynb", ["# NBVAL_CHECK_OUTPUT\nprint(1)"], execute=False))
    nb = nbformat.read(tmp_path / "error.ipynb", as_version=4)
    nb.cells[0].outputs.append(nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="x", traceback=[]))
    nbformat.write(nb, tmp_path / "error.ipynb")
    nb.cells[0].outputs = []
    nb.cells.append(nbformat.v4.new_code_cell("print(2)", execution_count=1))
    nb.cells[0].execution_count = 2
    nbformat.write(nb, tmp_path / "out_of_order.ipynb")

    assert notebook_problems(tmp_path / "unexecuted.ipynb")[0].startswith("1 code cell(s) never executed")
    assert "no cell is marked '# NBVAL_CHECK_OUTPUT'" in notebook_problems(tmp_path / "unchecked.ipynb")[0]
    assert "holds an error output (ZeroDivisionError)" in notebook_problems(tmp_path / "error.ipynb")[0]
    assert "executed out of order" in notebook_problems(tmp_path / "out_of_order.ipynb")[0]
    done = _pytest(tmp_path, "-k", "trnlab and rules")
    assert done.returncode == 1
    for name in ("unexecuted", "unchecked", "error", "out_of_order"):
        assert f"{name}.ipynb::trnlab rules" in done.stdout, done.stdout


def test_sanitize_masks_what_differs_between_machines():
    assert sanitize("device: neuron:0") == sanitize("device: cpu") == "device: <DEVICE>"
    assert sanitize("torch 2.13.0+cpu, transformers 5.24.0") == "torch <VERSION>, transformers <VERSION>"
    assert sanitize("/home/me/x/y and 12.5 s and 0x7f3a") == "<PATH> and <TIME> and <ADDR>"
    assert sanitize("Loss 7.6819, 42 graphs") == "Loss 7.6819, 42 graphs"  # numbers that are not timings stay
