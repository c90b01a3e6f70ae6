"""The set-up files agree with each other and never pull a CUDA torch on a CPU machine."""

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
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
    assert str(project["accelerate"].specifier) == ">=1.13"  # the first release with MULTI_NEURON; doctor's floor too
    assert "==" not in str(project["torch"].specifier)
    assert not project["torch"].specifier.contains("2.3.0")
    assert project["torch"].specifier.contains("2.13.0")


# A stand-in for `python3`: `-m venv DIR` makes DIR/bin/python, a copy of this script that logs each
# command it is given (one line, arguments in brackets) and plays torch and playwright missing, uv failing if told,
# pip installing uv as bin/uv and uninstalling it.
_FAKE_PYTHON = r"""#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
bin=$(dirname "$0"); line=""; for a in "$@"; do line="$line[$a]"; done; echo "$line" >> "$bin/../log"
case "$line" in
  "[-c][import "*) exit 1 ;;
  "[-m][pip][install][-q][uv]") touch "$bin/uv" ;;
  "[-m][pip][uninstall]"*) rm -f "$bin/uv" ;;
  "[-m][uv]"*) [ -z "$UV_FAILS" ] || exit 2 ;;
esac
exit 0
"""


def _make_setup(tmp_path, *args, **env):
    """``make setup browser-deps`` on a fresh machine whose python is :data:`_FAKE_PYTHON`: each command run."""
    fake = tmp_path / "python3"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    environ = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "--no-print-directory", "setup", "browser-deps", f"VENV={venv}", f"PYTHON={fake}",
                           *args], cwd=ROOT, capture_output=True, text=True, env={**environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (venv / ".trnlab-installed").exists()
    return (venv / "log").read_text().splitlines(), done.stdout


def test_make_setup_installs_a_pinned_torch_with_pip_then_the_course_with_uv_and_compiles_it(tmp_path):
    log, _ = _make_setup(tmp_path)
    lib = tmp_path / "venv" / "lib"
    assert log[:5] == ["[-c][import torch]", "[-m][pip][install][-q][--no-compile][torch==2.13.0]",
                       "[-m][pip][install][-q][uv]",
                       f"[-m][uv][pip][install][-q][--python][{tmp_path}/venv/bin/python][--compile-bytecode][-e][.]"
                       "[-c][trnlab/constraints.txt]",  # the tested versions, exactly
                       f"[-m][compileall][-q][-j0][-x][/torch/testing/_internal/py312_intrinsics\\.py$][{lib}]"]
    assert "[-m][uv][pip][install]" in log[6] and log[6].endswith("[playwright>=1.40]"), log   # browser-deps: uv too


def test_where_uv_cannot_install_pip_does_and_browser_deps_uses_pip(tmp_path):
    log, out = _make_setup(tmp_path, UV_FAILS="1")
    assert "uv could not install the course (above): installing with pip instead" in out
    assert log[3:6] == [f"[-m][uv][pip][install][-q][--python][{tmp_path}/venv/bin/python][--compile-bytecode][-e][.]"
                        "[-c][trnlab/constraints.txt]", "[-m][pip][uninstall][-q][-y][uv]",
                        "[-m][pip][install][-q][-e][.][-c][trnlab/constraints.txt]"], log
    assert log[6].startswith("[-m][compileall]") and log[8] == "[-m][pip][install][-q][playwright>=1.40]", log


def test_a_torch_range_given_as_torch_spec_stays_one_argument(tmp_path):
    log, _ = _make_setup(tmp_path, "TORCH_SPEC=torch>=2.13,<2.15 --index-url https://example.invalid/cpu")
    assert log[1] == "[-m][pip][install][-q][--no-compile][torch>=2.13,<2.15][--index-url][https://example.invalid/cpu]"
    assert not list(ROOT.glob("=*"))   # no file named after half a range: the shell redirected nothing


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_lab_opens_jupyterlab_on_the_notebooks():
    dry_run = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lab = [line for line in dry_run.splitlines() if "jupyter lab" in line]
    assert lab and lab[-1].endswith("notebooks/"), dry_run
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


def test_the_constraints_file_names_the_versions_the_stored_notebooks_ran_with():
    import json

    from packaging.version import Version

    from trnlab.run_record import stored_run, tested_versions

    tested = tested_versions()
    assert set(tested) == {"torch", "transformers", "accelerate"}
    assert tested["torch"] == re.search(r"torch==([\d.]+)", (ROOT / "Makefile").read_text()).group(1)  # TORCH_SPEC
    for name, version in tested.items():  # pyproject's ranges admit the tested versions
        assert _pyproject_requirements()[name].specifier.contains(version), (name, version)
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        run = stored_run(path)
        outputs = "".join("".join(o.get("text", "")) for c in json.loads(path.read_text())["cells"]
                          for o in c.get("outputs", []))
        accelerate = re.search(r"^torch \S+, transformers \S+, accelerate ([^,\s]+)", outputs, re.M).group(1)
        ran = {"torch": Version(run["torch"]).base_version, "transformers": run["transformers"],
               "accelerate": accelerate}
        assert ran == tested, f"{path.name} ran with {ran}; trnlab/constraints.txt says {tested}"


def test_makes_environment_holds_exactly_the_tested_versions():
    import sys

    from trnlab.run_record import _installed, tested_versions

    if not (Path(sys.prefix) / ".trnlab-installed").exists():
        pytest.skip(f"{sys.prefix} is not an environment `make` set up (no .trnlab-installed): its versions are yours")
    from packaging.version import Version

    installed = {name: Version(_installed(name)).base_version for name in tested_versions()}
    assert installed == tested_versions()
