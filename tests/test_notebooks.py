"""The committed notebooks follow the course's own rules.

Executed, in order, without errors and with checked cells: ``trnlab.pytest_plugin`` adds a
``trnlab rules`` item per notebook for those. Here: what every course notebook has besides.
"""

import json
import re
from pathlib import Path

import pytest

from trnlab.pytest_plugin import notebook_problems

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("*.ipynb"))


def _cells(path, kind="code"):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == kind and "".join(c["source"]).strip()]


def test_the_course_has_its_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "01_installation_check.ipynb" in names and len(names) == 5
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", n) for n in names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_plugin_rules(path):
    assert notebook_problems(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_its_parameter_cell(path):
    first = _cells(path)[0]
    source = "".join(first["source"])
    assert "parameters" in first["metadata"].get("tags", []), f"{path.name}: tag the first cell 'parameters'"
    for variable in ("TRNLAB_MODEL", "TRNLAB_DEVICE"):
        assert variable in source, f"{path.name}: the parameter cell must read {variable}"
    if "TRNLAB_DTYPE" not in source:
        # Then the bfloat16 pass does not run it again (trnlab.pytest_plugin): it must say why,
        # and really never read the setting, which only load_model/resolve_dtype do.
        assert "No dtype setting" in source, f"{path.name}: read TRNLAB_DTYPE, or say why not"
        code = "\n".join("".join(c["source"]) for c in _cells(path, "code"))
        calls = re.findall(r"load_model\((.*)", code) + re.findall(r"resolve_dtype\((.*)", code)
        assert calls and all("dtype=" in call for call in calls), f"{path.name}: pass dtype= to {calls}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_trnlab_and_ends_with_what_to_remember(path):
    sources = ["".join(c["source"]) for c in _cells(path)]
    assert any("import trnlab" in s or "from trnlab" in s for s in sources)
    last = "".join(_cells(path, "markdown")[-1]["source"])
    text = "\n".join("".join(c["source"]) for c in _cells(path, "markdown"))
    assert "What to remember" in text and "Try it" in text, f"{path.name}: end with 'What to remember' and 'Try it'"
    assert last


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checked_cells_print_no_device_specific_line(path):
    # A checked cell must hold on CPU, CUDA and neuron: no device names or backends pinned there.
    for cell in _cells(path):
        source = "".join(cell["source"])
        if "# NBVAL_CHECK_OUTPUT" not in source:
            continue
        text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                       for o in cell["outputs"])
        assert not re.search(r"\bon cpu\b|device: cpu|torch\.float32|backend: eager", text), (
            f"{path.name}: a checked cell prints a device-specific line: {source[:80]!r}")
