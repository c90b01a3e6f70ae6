"""The committed notebooks must be executed, clean, parameterised and really checked by nbval."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("*.ipynb"))


def _code_cells(path):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def test_the_course_has_its_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "01_installation_check.ipynb" in names
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", n) for n in names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed_and_clean(path):
    cells = _code_cells(path)
    counts = [c["execution_count"] for c in cells]
    assert None not in counts, f"{path.name}: unexecuted cells; run `make notebooks`"
    assert counts == sorted(counts) and counts[0] == 1, f"{path.name}: not run top to bottom"
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: error outputs: {[e['ename'] for e in errors]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_its_parameter_cell(path):
    first = _code_cells(path)[0]
    source = "".join(first["source"])
    assert "parameters" in first["metadata"].get("tags", []), f"{path.name}: tag the first cell 'parameters'"
    assert "os.environ" in source and "TRNLAB_MODEL" in source and "TRNLAB_DEVICE" in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_trnlab_and_nbval_checks_outputs(path):
    cells = _code_cells(path)
    sources = ["".join(c["source"]) for c in cells]
    assert any("import trnlab" in s or "from trnlab" in s for s in sources)
    checked = [c for c, s in zip(cells, sources) if "# NBVAL_CHECK_OUTPUT" in s]
    assert checked, f"{path.name}: mark deterministic cells with # NBVAL_CHECK_OUTPUT"
    assert all(c["outputs"] for c in checked), f"{path.name}: a checked cell has no output to compare"
