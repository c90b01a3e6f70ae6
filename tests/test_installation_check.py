"""Notebook 01's instructions and its stand-in cell, run as the notebook prints and runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trnlab.standin import cache_dir

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_installation_check.ipynb"
CELLS = json.loads(NOTEBOOK.read_text())["cells"]
KERNEL_INSTALL = "python -m ipykernel install "


def _printed_commands(start: str) -> list[str]:
    """The lines of notebook 01's markdown that start with ``start``, as printed."""
    return [line.strip() for cell in CELLS if cell["cell_type"] == "markdown"
            for line in "".join(cell["source"]).splitlines() if line.strip().startswith(start)]


def _code_cell(marker: str) -> str:
    (source,) = ["".join(c["source"]) for c in CELLS if c["cell_type"] == "code" and marker in "".join(c["source"])]
    return source


def _run_in_kernel(name: str, code: str) -> str:
    """What ``code`` prints in a new kernel of kernel spec ``name``; the kernel is shut down after."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name=name, startup_timeout=120)
    printed = []
    try:
        reply = client.execute_interactive(code, timeout=60, output_hook=lambda msg: printed.append(
            msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""))
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return "".join(printed).strip()


def test_the_printed_kernel_specs_give_each_kernel_its_own_cores(tmp_path, monkeypatch):
    commands = _printed_commands(KERNEL_INSTALL)
    assert len(commands) == 2, f"notebook 01 section 1 prints two `{KERNEL_INSTALL}...` lines, found {commands}"
    venv_bin = Path(sys.executable).parent  # `python`: the course venv's, as in a terminal where it is activated
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))  # where --user installs, here a temporary one
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    for command in commands:
        subprocess.run(["bash", "-ec", command], check=True, capture_output=True, text=True, timeout=120)
    specs = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "jupyter" / "kernels").glob("*/kernel.json")}
    assert {name: spec["env"] for name, spec in specs.items()} == {
        "cores-0-1": {"NEURON_RT_VISIBLE_CORES": "0-1"}, "cores-2-3": {"NEURON_RT_VISIBLE_CORES": "2-3"}}
    seen = {name: _run_in_kernel(name, "import os; print(os.environ.get('NEURON_RT_VISIBLE_CORES'))")
            for name in sorted(specs)}
    assert seen == {"cores-0-1": "0-1", "cores-2-3": "2-3"}  # two kernels of one Jupyter, different cores


def test_the_stand_in_cell_on_a_neuron_device_starts_no_stand_in(fake_neuron, monkeypatch, capsys):
    def no_process(*args, **kwargs):
        raise AssertionError("the cell started the stand-in beside a neuron device")

    monkeypatch.setattr(subprocess, "run", no_process)
    exec(_code_cell("page_line = "), {"torch": torch, "report": SimpleNamespace(backend="neuron")})
    assert capsys.readouterr().out == ("this kernel is on a real neuron device: the page's line above ran in it, no "
                                       "stand-in process needed\n")
    fake_neuron.standin = True  # a kernel started with TRNLAB_NEURON_STANDIN=1
    exec(_code_cell("page_line = "), {"torch": torch, "report": SimpleNamespace(backend="neuron")})
    assert capsys.readouterr().out.startswith("this kernel is on the STAND-IN neuron device:")


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None and not (cache_dir() / "ready").exists(),
                    reason="the stand-in is built with a C++ compiler: apt-get install g++")
def test_the_stand_in_cell_elsewhere_runs_the_page_line_on_the_stand_in(monkeypatch, capsys):
    monkeypatch.delattr(torch, "neuron", raising=False)  # no TorchNeuron in this process, as on a laptop
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(NOTEBOOK.parent.parent), os.environ.get("PYTHONPATH", "")]))
    exec(_code_cell("page_line = "), {"torch": torch, "report": SimpleNamespace(backend="cpu")})
    first, second = capsys.readouterr().out.splitlines()
    assert first == "TRNLAB_NEURON_STANDIN=1: True 4"
    assert second.startswith("STAND-IN neuron device")
