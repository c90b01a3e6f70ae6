"""trnlab's public API: one ``__all__``, every name documented, and docs/api.md in step."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import trnlab

ROOT = Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"


def test_every_exported_name_resolves_and_has_a_docstring():
    undocumented = []
    for name in trnlab.__all__:
        value = getattr(trnlab, name)
        if name in trnlab._CONSTANTS:
            assert isinstance(value, str) and trnlab._CONSTANTS[name]
        elif not (getattr(value, "__doc__", None) or "").strip():
            undocumented.append(name)
    assert not undocumented, f"add a docstring to: {undocumented}"
    assert len(trnlab.__all__) == len(set(trnlab.__all__))


def test_launch_is_the_function_not_a_module():
    import importlib

    assert callable(trnlab.launch) and trnlab.launch.__module__ == "trnlab.launcher"
    importlib.import_module("trnlab.launcher")  # importing the module must not shadow the function
    assert callable(trnlab.launch)


def test_import_is_light_and_len_all_works():
    done = subprocess.run([sys.executable, "-c", "import sys, trnlab; print(len(trnlab.__all__)); "
                           "print('transformers' in sys.modules)"], capture_output=True, text=True, check=True)
    count, heavy = done.stdout.split()
    assert int(count) == len(trnlab.__all__) and heavy == "False"


def test_unknown_names_raise_attribute_error():
    try:
        trnlab.no_such_helper
    except AttributeError as error:
        assert "no_such_helper" in str(error)
    else:
        raise AssertionError("expected AttributeError")


def test_api_reference_lists_all():
    section = API_MD.read_text().split("## Top-level names", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)`", section, flags=re.M)
    assert sorted(listed) == sorted(trnlab.__all__), (
        f"docs/api.md lacks {sorted(set(trnlab.__all__) - set(listed))}, has extra {sorted(set(listed) - set(trnlab.__all__))}")


def test_torchrun_command_for_this_machine():
    one = trnlab.torchrun_command("train.py", ["--steps", 2])
    assert "--standalone" in one and any(a.startswith("--nproc-per-node=") for a in one)
    assert one[-3:] == ["train.py", "--steps", "2"]


def test_validate_parallel_sizes_checks_the_course_model_by_default():
    config = trnlab.load_config()
    too_wide = config.num_attention_heads * 2
    try:
        trnlab.validate_parallel_sizes(too_wide, tp_size=too_wide)
    except trnlab.PlanError as error:
        assert f"tp_size={too_wide} does not divide the model's attention heads" in str(error)
    else:
        raise AssertionError("tp larger than the head count must be refused without a model_config")
    assert trnlab.validate_parallel_sizes(too_wide, tp_size=too_wide, check_model=False)["tp_size"] == too_wide


def test_api_reference_is_generated_from_the_code(capsys):
    # In this process (trnlab is imported already), not a new interpreter: the tool's own --check.
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--check"]) == 0, capsys.readouterr().err
