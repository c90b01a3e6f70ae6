"""The set-up files agree with each other and never pull a CUDA torch on a CPU machine."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_requirements():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {Requirement(r).name: Requirement(r) for r in data["project"]["dependencies"]}


def _conda_pip_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return {Requirement(r).name: Requirement(r) for r in pip if not r.startswith("-")}


def test_environment_yml_installs_the_same_packages_as_pyproject():
    project, conda = _pyproject_requirements(), _conda_pip_requirements()
    assert set(project) == set(conda)
    for name in project:
        if name != "torch":  # conda pins the CPU build; pyproject must not pin torch
            assert project[name].specifier == conda[name].specifier, name


def test_course_dependencies_and_torch_not_pinned():
    project = _pyproject_requirements()
    assert {"torch", "transformers", "accelerate", "jupyterlab", "ipywidgets", "matplotlib",
            "nbval", "pytest"} <= set(project)
    assert str(project["transformers"].specifier) in ("<6,>=5.23", ">=5.23,<6")
    assert "==" not in str(project["torch"].specifier)
    assert not project["torch"].specifier.contains("2.3.0")
    assert project["torch"].specifier.contains("2.13.0")


def test_makefile_installs_a_pinned_torch_with_pip_then_the_project_with_uv_or_pip(tmp_path):
    import subprocess

    venv = tmp_path / "venv"   # none yet: the Makefile's own set-up, as on a fresh machine (dry run)
    dry = subprocess.run(["make", "-n", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    torch_at = dry.index(f"{venv}/bin/python -m pip install -q --no-compile torch==2.13.0")
    uv_at = dry.index(f"{venv}/bin/python -m uv pip install -q --python {venv}/bin/python --compile-bytecode -e .")
    fallback_at = dry.index(f"{venv}/bin/python -m pip install -q -e .")
    compile_at = dry.index(f"{venv}/bin/python -m compileall -qq -j0 {venv}/lib")  # torch was installed uncompiled
    assert torch_at < uv_at < fallback_at < compile_at < dry.index(f"touch {venv}/.trnlab-installed"), dry


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_lab_opens_jupyterlab_on_the_notebooks():
    import subprocess

    dry_run = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lab = [line for line in dry_run.splitlines() if "jupyter lab" in line]
    assert lab and lab[-1].endswith("notebooks/"), dry_run
    import os
    if os.geteuid() == 0:  # JupyterLab refuses root without this flag
        assert "--allow-root" in lab[-1]


def test_readme_settings_tables_list_every_variable_the_notebooks_and_package_read():
    import json

    read = set()
    for path in [*(ROOT / "notebooks").glob("[0-9]*.ipynb")]:
        cells = json.loads(path.read_text())["cells"]
        read |= {name for c in cells if c["cell_type"] == "code"
                 for name in re.findall(r"\bTRNLAB_[A-Z_]+\b", "".join(c["source"]))}
    for path in (ROOT / "trnlab").rglob("*.py"):
        read |= set(re.findall(r"\bTRNLAB_[A-Z_]+\b", path.read_text()))
    read.discard("TRNLAB_LAUNCH_ID")  # set by trnlab.launch in its own children, never by a user
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Settings", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(TRNLAB_[A-Z_]+)`", section))
    assert read, "no TRNLAB_ variable found: the scan is broken"
    assert read - listed == set(), f"add to the README's settings tables: {sorted(read - listed)}"
    assert listed - read == set(), f"the README lists variables nothing reads: {sorted(listed - read)}"


def test_the_environments_modules_are_byte_compiled():
    # Where PYTHONDONTWRITEBYTECODE is set (CI images often set it), a module without a .pyc is compiled
    # again by every process that imports it: torch alone would cost each notebook kernel and rank seconds.
    import importlib.util

    import torch
    import transformers

    for module in (torch, transformers, torch.nn.modules.module):
        assert Path(importlib.util.cache_from_source(module.__file__)).exists(), f"{module.__name__} has no .pyc"
