"""The committed notebooks carry what JupyterLab would write, so opening them changes nothing.

Fix a failure with `python tools/normalize_notebooks.py` (`make notebooks` runs it too).
"""

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "tools"))
import normalize_notebooks  # noqa: E402

FIX = "run `python tools/normalize_notebooks.py`"


def _machine_paths():
    """Absolute folders of this machine that no stored output may name."""
    paths = {str(ROOT), os.path.realpath(ROOT), tempfile.gettempdir(), "/tmp", os.path.expanduser("~"), sys.prefix}
    return sorted({p for p in paths if p not in ("", "/")}, key=len, reverse=True)


def _output_texts(nb):
    for index, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            texts = [output.get("text", ""), output.get("evalue", ""), *output.get("traceback", [])]
            texts += [v for m, v in output.get("data", {}).items() if m.startswith("text/")]
            for text in texts:
                yield index, "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_the_installed_kernelspec(path):
    installed = KernelSpecManager().get_kernel_spec("python3")
    metadata = json.loads(path.read_text())["metadata"]
    assert metadata["kernelspec"] == {"display_name": installed.display_name, "language": installed.language,
                                      "name": "python3"}, f"{path.name}: {FIX}"
    assert metadata["language_info"]["name"] == "python"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_stored_output_names_a_path_of_this_machine(path):
    nb = json.loads(path.read_text())
    pattern = re.compile("|".join(rf"(?<![\w.+-]){re.escape(p)}(?![\w.+-])" for p in _machine_paths())
                         + r"|(?:/[\w.+-]+)+/(?:site|dist)-packages\b")
    found = [(i, m.group(0)) for i, text in _output_texts(nb) for m in pattern.finditer(text)]
    assert not found, f"{path.name}: cells {sorted({i for i, _ in found})} name {sorted({p for _, p in found})}: {FIX}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_normalized(path):
    """Nothing else to normalize: widget state, JS-style numbers, nbformat's own formatting."""
    assert path.read_text(encoding="utf-8") == normalize_notebooks.normalized_text(path), f"{path.name}: {FIX}"


def test_normalizer_replaces_machine_paths_and_stale_widget_state(tmp_path):
    nb = {"cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {"execution": {"iopub.status.busy": "2026-11-29T16:41:07Z"}},
                     "source": "", "outputs": [
                         {"output_type": "stream", "name": "stdout", "text": [
                             f"model {ROOT}/trnlab/assets/tiny-qwen3\n",
                             f"cache {tempfile.gettempdir()}/trnlab-05-abc/run, {sys.prefix}/lib/python3.11/site-packages/x.py\n"]},
                         {"output_type": "display_data", "metadata": {}, "data": {
                             "text/plain": "HBox()", "application/vnd.jupyter.widget-view+json":
                                 {"model_id": "aa", "version_major": 2, "version_minor": 0}}}]}],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                       "widgets": {"application/vnd.jupyter.widget-state+json": {"version_major": 2, "version_minor": 0,
                           "state": {"aa": {"state": {"children": ["IPY_MODEL_bb"], "max": 46.0}},
                                     "bb": {"state": {}}, "cc": {"state": {}}}}}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    assert normalize_notebooks.main([str(path), "--root", str(ROOT)]) == 0
    text = path.read_text()
    out = json.loads(text)
    assert text.endswith("}\n") and text.startswith('{\n "cells": [\n  {\n')
    assert "".join(out["cells"][0]["outputs"][0]["text"]) == (
        "model trnlab/assets/tiny-qwen3\ncache <tmp>/trnlab-05-abc/run, <site-packages>/x.py\n")
    assert out["metadata"]["kernelspec"]["display_name"] == "Python 3 (ipykernel)"
    assert set(out["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]) == {"aa", "bb"}
    assert '"max": 46\n' in text and out["cells"][0]["metadata"] == {}
    assert normalize_notebooks.main([str(path), "--check", "--root", str(ROOT)]) == 0
