"""The committed notebooks follow the course's own rules.

Executed, in order, without errors and with checked cells: ``trnlab.pytest_plugin`` adds a
``trnlab rules`` item per notebook for those. Here: what every course notebook has besides.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from trnlab.pytest_plugin import notebook_problems
from trnlab.run_record import stored_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from sync_intros import intro_duration  # noqa: E402  (the tool that writes the figures into the intros)

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.joinpath("notebooks").glob("*.ipynb"))


def _cells(path, kind="code"):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == kind and "".join(c["source"]).strip()]


def test_the_course_has_its_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "01_installation_check.ipynb" in names and "02_inference.ipynb" in names
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", n) for n in names), names
    # seven lessons, numbered 01 to 07 without a gap (05 distributed sharding, 06 planning a real run, 07 checkpoints)
    assert [int(n[:2]) for n in names] == list(range(1, 8)), names


SUMMARY_CALL = "print(trnlab.run_summary())"
SUMMARY_LINE = re.compile(r"this notebook compiled (\d+) graph\(s\) in (\d+) s on \S+")


def test_intro_duration_rounds_as_the_convention_says():
    assert [intro_duration(s) for s in (0, 6, 12, 44, 45, 62, 89, 90, 149, 151, 600)] == [
        "about 1 s", "about 6 s", "about 10 s", "about 40 s", "about 50 s", "about 60 s", "about 90 s", "about 2 min",
        "about 2 min", "about 3 min", "about 10 min"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ends_with_its_run_summary_and_the_intro_quotes_it(path):
    last = _cells(path)[-1]
    assert "".join(last["source"]).strip() == SUMMARY_CALL, f"{path.name}: end with a cell `{SUMMARY_CALL}`"
    assert "# NBVAL_CHECK_OUTPUT" not in "".join(last["source"])  # a timing: never compared
    stored = "".join("".join(o.get("text", "")) for o in last["outputs"] if o.get("name") == "stdout")
    found = SUMMARY_LINE.match(stored)
    assert found, f"{path.name}: the last cell has no stored run summary; re-execute the notebook"
    graphs, seconds = int(found.group(1)), int(found.group(2))
    assert "on a trn2" in stored.splitlines()[1] and "estimate" in stored.splitlines()[1]
    intro = " ".join("".join(_cells(path, "markdown")[0]["source"]).split())
    said_time = re.findall(r"about \d+ (?:s|min)\b", intro)
    said_graphs = re.findall(r"(\d+) graph\(s\)", intro)
    assert said_time == [intro_duration(seconds)], (
        f"{path.name}: the introduction must say {intro_duration(seconds)!r} (last run: {seconds} s), says {said_time}")
    assert said_graphs == [str(graphs)], (
        f"{path.name}: the introduction must say '{graphs} graph(s)' (the last cell's count), says {said_graphs}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_plugin_rules(path):
    assert notebook_problems(path, require_all_executed=True) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_outputs_come_from_the_stand_in_or_a_trn2(path):
    run = stored_run(path)  # what trnlab.setup() recorded with the outputs (trnlab.run_record)
    assert run is not None, f"{path.name}: no run record (trnlab.setup()'s line): re-execute it with make notebooks"
    where = f"{path.name}: its outputs come from {run['device']}{' (STAND-IN)' if run.get('standin') else ''}"
    assert run["device"] == "neuron", f"{where}: re-execute it on the stand-in with make notebooks"
    assert run.get("standin") or run.get("torch-neuronx"), f"{where}, with no torch-neuronx to show a real trn2"
    if "TRNLAB_DTYPE" in "".join(_cells(path)[0]["source"]):  # else it fixes its dtype, saying why (05: float32)
        assert run["dtype"] == "bfloat16", f"{where} in {run['dtype']}: a trn2 computes in bfloat16 (make notebooks)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_its_parameter_cell(path):
    first = _cells(path)[0]
    source = "".join(first["source"])
    assert "parameters" in first["metadata"].get("tags", []), f"{path.name}: tag the first cell 'parameters'"
    for variable in ("TRNLAB_MODEL", "TRNLAB_DEVICE"):
        assert variable in source, f"{path.name}: the parameter cell must read {variable}"
    if "TRNLAB_DTYPE" not in source:
        # Then the bfloat16 pass does not run it again (trnlab.pytest_plugin): it must say why,
        # and really never read the setting, which only setup/load_model/resolve_dtype do without dtype=.
        assert "No dtype setting" in source, f"{path.name}: read TRNLAB_DTYPE, or say why not"
        code = "\n".join("".join(c["source"]) for c in _cells(path, "code"))
        calls = [call for name in ("setup", "load_model", "resolve_dtype") for call in re.findall(rf"{name}\((.*)", code)]
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
    # A checked cell must hold on CPU, CUDA and neuron: no device names or backends pinned there, unless it is tagged
    # as depending on them (trnlab.pytest_plugin compares it only in a run on the device and dtype it was stored from).
    for cell in _cells(path):
        source = "".join(cell["source"])
        tags = set(cell["metadata"].get("tags", []))
        if "# NBVAL_CHECK_OUTPUT" not in source or tags & {"device-dependent", "dtype-dependent"}:
            continue
        text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                       for o in cell["outputs"])
        assert not re.search(r"\bon cpu\b|device: cpu|torch\.float32|backend: eager", text), (
            f"{path.name}: a checked cell prints a device-specific line: {source[:80]!r}")


PROGRESS_BAR = re.compile(r"\d+%\|")  # tqdm's "Loading weights:   0%|          | 0/46"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_stored_output_is_a_progress_bar(path):
    # A saved progress bar keeps its first frame ("0%") forever: load with the bar off instead.
    for cell in _cells(path):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))
            assert not PROGRESS_BAR.search(text), f"{path.name}: a stored progress bar: {text[:80]!r}"


def test_sync_intros_copies_the_measured_figures_into_the_introduction():
    from sync_intros import synced_intro

    intro = "It takes about 40 s and compiles 16 graph(s); the last cell counts them."
    assert synced_intro(intro, graphs=3, seconds=151) == (
        "It takes about 3 min and compiles 3 graph(s); the last cell counts them.")
    assert synced_intro(intro, graphs=16, seconds=42) == intro
    with_neffs = intro + " A trn2 compiles 12 NEFF(s) (6 forward, 6 backward, 0 inference)."
    synced = synced_intro(with_neffs, 16, 42, (10, 0, 0, 10))
    assert synced.endswith("10 NEFF(s) (0 forward, 0 backward, 10 inference).")
    assert synced_intro(with_neffs, 16, 42, None) == with_neffs   # stored off Neuron: left as it is
    with pytest.raises(ValueError, match="once each"):
        synced_intro("It takes about 4 s, or about 5 s, and compiles 1 graph(s).", graphs=1, seconds=4)


def test_readme_notebook_table_holds_each_notebooks_measured_graph_count():
    from sync_intros import README, measured, synced_readme

    graphs = {p.stem: measured(json.loads(p.read_text()))[0] for p in NOTEBOOKS}
    text = README.read_text()
    assert synced_readme(text, graphs) == text, "run python tools/sync_intros.py notebooks/[0-9]*.ipynb"
    changed = synced_readme(text, {**graphs, "03_compiled_generation": 999})
    assert "| 999 |" in changed and changed.count("| 999 |") == 1


def _neff_rows(text):
    from sync_intros import NEFF_ROW

    table = text.split("<!-- neff-table", 1)[1].split("<!-- end of neff-table -->", 1)[0]
    return {m[1].strip("`*"): tuple(int(n) for n in re.findall(r"\d+", m[0].split("|", 2)[2]))
            for m in NEFF_ROW.finditer(table)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_readme_neff_table_and_intro_hold_the_stored_neff_count(path):
    from sync_intros import README, stored_neffs

    neffs = stored_neffs(json.loads(path.read_text()))
    run = stored_run(path)
    if neffs is None and (run is None or run["device"] != "neuron"):
        pytest.skip(f"{path.name}: stored off Neuron, no NEFF count (re-execute with TRNLAB_NEURON_STANDIN=1; "
                    "test_notebook_outputs_come_from_the_stand_in_or_a_trn2 requires it)")
    assert neffs is not None, f"{path.name}: stored on neuron but its last cell prints no NEFF count"
    assert neffs[0] == sum(neffs[1:]), f"{path.name}: {neffs}: every NEFF is a forward, a backward or an inference"
    assert _neff_rows(README.read_text())[path.stem] == neffs, "run python tools/sync_intros.py notebooks/[0-9]*.ipynb"
    intro = " ".join("".join(_cells(path, "markdown")[0]["source"]).split())
    said = "{} NEFF(s) ({} forward, {} backward, {} inference)".format(*neffs)
    assert said in intro, f"{path.name}: the introduction must say {said!r}"


def test_readme_neff_table_sums_within_the_course_budget_and_sync_rewrites_it():
    from sync_intros import README, synced_neff_table

    text = README.read_text()
    rows = _neff_rows(text)
    assert set(rows) == {p.stem for p in NOTEBOOKS} | {"total"}
    assert rows.pop("total") == tuple(map(sum, zip(*rows.values())))
    assert sum(n for n, *_ in rows.values()) <= 24, "issue 31: the course compiles at most 24 NEFFs on a first run"
    assert synced_neff_table(text, {}) == text
    changed = _neff_rows(synced_neff_table(text, {"04_training": (30, 15, 15, 0)}))
    assert changed["04_training"] == (30, 15, 15, 0)
    assert changed["total"][0] == sum(n for n, *_ in rows.values()) - rows["04_training"][0] + 30
