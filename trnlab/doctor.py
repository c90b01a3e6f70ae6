"""``python -m trnlab doctor``: can the course run on this machine, and if not, why not.

Prints the device report (like ``neuron-ls`` plus versions and the compile cache) and a list
of checks; ``--json`` prints the same as JSON. Exit status 0 when every check passes. A
malformed ``TRNLAB_*`` setting is a failed check naming the variable, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import importlib.metadata

from packaging.requirements import Requirement
from packaging.version import Version

from trnlab.device import (RELEASE_CORES_HINT, DeviceNotAvailableError, DeviceReport, device_report,
                           format_core_holders, neuron_core_holders, pick_device)
from trnlab.models import BUNDLED_MODEL_DIR, MODEL_ENV_VAR, is_bundled, missing_model_files, model_name
from trnlab.settings import DEVICE_ENV_VAR, SettingError, read_setting, setting_problems

__all__ = ["CHECKED_PACKAGES", "required_versions", "Check", "run_checks", "format_report", "show_report",
           "main"]

#: The packages whose versions doctor checks against what trnlab's own metadata requires.
CHECKED_PACKAGES = ("transformers", "accelerate")


def required_versions() -> dict[str, str]:
    """``{package: specifier}`` for :data:`CHECKED_PACKAGES`, read from trnlab's installed metadata.

    One source of truth: ``pyproject.toml``'s dependencies, as pip installed them.
    """
    found = {}
    for line in importlib.metadata.requires("trnlab") or []:
        requirement = Requirement(line)
        if requirement.name in CHECKED_PACKAGES and requirement.marker is None:
            found[requirement.name] = str(requirement.specifier)
    return found


@dataclass
class Check:
    """One line of the machine report: what was checked, whether it passed, and the detail."""

    name: str
    ok: bool
    detail: str


def _version_check(package: str, installed: str | None) -> Check:
    wanted = required_versions().get(package, "")
    if installed is None:
        return Check(package, False, f"not installed: pip install '{package}{wanted}'")
    ok = Version(installed) in Requirement(f"{package}{wanted}").specifier
    return Check(package, ok, f"{installed} (course needs {wanted or 'any'})" +
                 ("" if ok else f": pip install '{package}{wanted}'"))


def _shown(name: str) -> str:
    # The bundled model's folder is a path of this machine: name it the same way everywhere.
    return "the bundled tiny Qwen3 (trnlab/assets/tiny-qwen3)" if is_bundled(name) else name


def _settings_checks() -> list[Check]:
    """One ``[FAIL]`` per malformed ``TRNLAB_*`` variable (its message names the valid values); none when all are fine."""
    return [Check(variable, False, message) for variable, message in setting_problems().items()]


def _model_check() -> Check:
    # read_setting, not read_settings: a bad TRNLAB_DTYPE must not hide the model's own state.
    name = model_name(read_setting(MODEL_ENV_VAR) or BUNDLED_MODEL_DIR)
    path = Path(name)
    if path.is_dir():
        missing = missing_model_files(path, "model") + missing_model_files(path, "tokenizer")
        if missing:
            return Check("model", False, f"{name} lacks {', '.join(missing)}: rebuild with "
                         "`python -m trnlab.assets build` or point TRNLAB_MODEL at a full model folder")
        return Check("model", True, f"{_shown(name)} (local folder)")
    if is_bundled(name) or path.is_absolute() or name.startswith("."):
        return Check("model", False, f"no model folder at {name}: " + (
            "build the course model with `python -m trnlab.assets build`" if is_bundled(name)
            else f"fix {MODEL_ENV_VAR} or unset it to use the bundled model"))
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return Check("model", True, f"{name} (in the Hugging Face cache)")
    return Check("model", False, f"{MODEL_ENV_VAR}={name} is neither a local folder nor in the "
                 f"Hugging Face cache: pre-download it (`hf download {name}`) or unset {MODEL_ENV_VAR}")


def _device_check(report: DeviceReport) -> Check | None:
    try:
        requested = read_setting(DEVICE_ENV_VAR)
    except SettingError:
        return None  # reported by the settings check, with the valid forms
    try:
        device = pick_device(requested, verbose=False)
    except (DeviceNotAvailableError, ValueError) as exc:
        return Check("device", False, f"{DEVICE_ENV_VAR}={requested}: {exc}")
    return Check("device", True, f"{device} ({DEVICE_ENV_VAR}={requested}; "
                 f"{report.device_count} {report.backend} device(s))")


def _cores_check(report: DeviceReport) -> Check | None:
    """On Trainium: fail when another process holds NeuronCores (``neuron-ls``'s PID column)."""
    if report.neuron_ls is None:
        return None
    holders = neuron_core_holders(report.neuron_ls, ignore_pids=(os.getpid(), os.getppid()))
    if not holders:
        return Check("neuron cores", True, "no other process holds a NeuronCore")
    return Check("neuron cores", False, f"held by {format_core_holders(holders)}: {RELEASE_CORES_HINT}")


def run_checks(report: DeviceReport) -> list[Check]:
    """The checks that decide the exit status of ``doctor``."""
    checks = [
        *_settings_checks(),
        _device_check(report),
        _version_check("transformers", report.versions.get("transformers")),
        _version_check("accelerate", report.versions.get("accelerate")),
        _model_check(),
        _cores_check(report),
    ]
    return [check for check in checks if check is not None]


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def format_report(report: DeviceReport, checks: list[Check]) -> str:
    """The report and checks as a plain-text table."""
    rows = [
        ("backend", report.backend),
        ("devices", str(report.device_count)),
        ("bf16 native", "yes" if report.bf16_supported else "no"),
        ("available", ", ".join(f"{b}={'yes' if ok else 'no'}" for b, ok in report.available.items())),
    ]
    rows += [(name, version or "not installed") for name, version in report.versions.items()]
    rows += [(name, value if value is not None else "(unset)") for name, value in report.neuron_env.items()]
    cache = report.neff_cache
    rows.append(("NEFF cache", f"{cache['path']}: " + (
        f"{cache['files']} files, {_human_bytes(cache['bytes'])}" if cache["exists"] else "does not exist yet")))
    width = max(len(k) for k, _ in rows)
    lines = ["trnlab doctor", "-" * 60] + [f"{k:<{width}}  {v}" for k, v in rows]
    lines += ["-" * 60, "neuron-ls:", "  " + (report.neuron_ls or "(not installed: no Neuron tools here)").replace("\n", "\n  ")]
    lines += [f"note: {note}" for note in report.notes]
    lines += ["-" * 60, "checks:"]
    lines += [f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in checks]
    failed = [c.name for c in checks if not c.ok]
    lines.append("The course can run here." if not failed else f"The course cannot run here: fix {', '.join(failed)}.")
    return "\n".join(lines)


def show_report() -> DeviceReport:
    """Print the doctor table (report and checks) and return the report; notebook 01 uses it."""
    report = device_report()
    print(format_report(report, run_checks(report)))
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab doctor [--json]``: print the machine report; exit status 1 if a check failed."""
    parser = argparse.ArgumentParser(prog="python -m trnlab doctor",
                                     description="Check that this machine can run the course.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = device_report()
    checks = run_checks(report)
    if args.json:
        print(json.dumps({**report.to_dict(), "checks": [asdict(c) for c in checks],
                          "ok": all(c.ok for c in checks)}, indent=2))
    else:
        print(format_report(report, checks))
    return 0 if all(c.ok for c in checks) else 1
