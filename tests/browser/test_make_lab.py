"""`make lab` in an environment it did not create installs only what is missing and writes nothing
into it. No browser needed: runs with the rest of tests/browser, never skipped."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def _foreign_venv(tmp_path: Path, with_packages: bool) -> Path:
    """A venv not made by the Makefile: this interpreter's, seen through a pyvenv.cfg of ours, with
    (a link to) this environment's packages or with none."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "bin" / "python").symlink_to(base if base.exists() else Path(sys.executable).resolve())
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n"
                                     f"version = {sys.version.split()[0]}\n")
    if with_packages:
        (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    return venv


def test_make_setup_in_a_complete_foreign_env_installs_nothing(tmp_path):
    venv = _foreign_venv(tmp_path, with_packages=True)
    before = sorted(p.name for p in venv.iterdir())
    result = _make("setup", f"VENV={venv}", "PIP=echo WOULD-RUN pip")
    assert result.returncode == 0, result.stderr
    assert "installing nothing" in result.stdout and "WOULD-RUN" not in result.stdout, result.stdout
    assert sorted(p.name for p in venv.iterdir()) == before  # no stamp file, nothing else


def test_make_setup_in_an_empty_foreign_env_says_what_it_installs(tmp_path):
    venv = _foreign_venv(tmp_path, with_packages=False)
    result = _make("setup", f"VENV={venv}", "PIP=echo WOULD-RUN pip")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torch is not installed" in out and "WOULD-RUN pip install -q torch==2.13.0" in out, out
    assert "trnlab is not installed" in out and "WOULD-RUN pip install -q -e ." in out, out
    assert "--upgrade pip" not in out and not (venv / ".trnlab-installed").exists()


def test_make_lab_keeps_allow_root_and_the_course_settings_with_lab_args(tmp_path):
    venv = _foreign_venv(tmp_path, with_packages=True)
    dry = _make("-n", "lab", f"VENV={venv}", "LAB_ARGS=--no-browser --port 8899").stdout
    lab = [line for line in dry.splitlines() if "/jupyter lab " in line][-1]
    assert "--no-browser --port 8899" in lab and lab.endswith("notebooks/")
    assert ("--allow-root" in lab) == (os.geteuid() == 0)
    assert f"JUPYTER_CONFIG_PATH=\"{ROOT}/jupyter" in lab
    assert "--upgrade pip" not in dry and ".trnlab-installed" not in dry and "touch" not in dry


def test_the_shipped_lab_settings_turn_off_the_news_prompt():
    import json

    overrides = json.loads((ROOT / "jupyter" / "labconfig" / "default_setting_overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert shutil.which("make")


def test_make_setup_in_a_foreign_env_without_pip_says_how_to_add_it(tmp_path):
    venv = _foreign_venv(tmp_path, with_packages=False)  # no packages at all: no pip either, as uv makes them
    before = sorted(p.name for p in venv.iterdir())
    result = _make("setup", f"VENV={venv}")
    assert result.returncode != 0
    assert result.stdout.splitlines() == [
        "make setup: torch is not installed", "make setup: trnlab is not installed",
        f"make setup: {venv} has no pip to install them with (uv makes environments without it): add it with",
        f"  {venv}/bin/python -m ensurepip", "then run make again, or install them yourself."], result.stdout
    assert sorted(p.name for p in venv.iterdir()) == before
