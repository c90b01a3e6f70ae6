"""``python -m trnlab doctor``: can the course run on this machine, and if not, why not.
Prints the device report and a list of checks (``--json``: as JSON); exit status 0 when every check passes."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from trnlab.device import (_BACKENDS, _DEFAULT_NEFF_CACHE, _NEFF_CACHE_VAR, _RELEASE_CORES_HINT, _backend_available,
                           _bf16_supported, _device_count, _format_core_holders, _neuron_core_holders, _neuron_ls_output,
                           _package_versions, pick_device)
from trnlab.models import _BUNDLED_MODEL_DIR, _MODEL_ENV_VAR, _is_bundled, _missing_model_files, model_name
from trnlab.rank_cores import _VISIBLE_CORES_VAR as VISIBLE_CORES_VAR
from trnlab.settings import _DEVICE_ENV_VAR, NotAvailableError, SettingError, _read_setting, _setting_problems

__all__ = ["DeviceReport", "device_report", "run_checks", "show_report"]


@dataclass
class _Check:
    """One line of the machine report: what was checked, whether it passed, and the detail."""

    name: str
    ok: bool
    detail: str


#: Lowest versions doctor asks for itself, and why: an editable install keeps the metadata it was installed with.
_FLOORS = {"accelerate": ("1.13", "1.13 is the first release with MULTI_NEURON, Accelerate's distributed type for "
                                  "Neuron (1.12 has no neuron code)")}


def _wanted(package: str) -> SpecifierSet:
    """What trnlab's installed metadata (pyproject) asks of ``package``, its lower bound raised to :data:`_FLOORS`."""
    wanted = next((r.specifier for r in map(Requirement, importlib.metadata.requires("trnlab") or [])
                   if r.name == package and r.marker is None), SpecifierSet())
    floor = _FLOORS.get(package, (None,))[0]
    if floor is None or any(s.operator == ">=" and Version(s.version) >= Version(floor) for s in wanted):
        return wanted
    return SpecifierSet(",".join([str(s) for s in wanted if s.operator != ">="] + [f">={floor}"]))


def _version_check(package: str, installed: str | None) -> _Check:
    """``package``'s installed version against what the course needs (:func:`_wanted`)."""
    wanted = _wanted(package)
    if installed is None:
        return _Check(package, False, f"not installed: pip install '{package}{wanted}'")
    ok = Version(installed) in wanted
    why = f": {_FLOORS[package][1]}" if package in _FLOORS else ""
    return _Check(package, ok, f"{installed} (course needs {wanted or 'any'})" +
                  ("" if ok else f"{why}: pip install '{package}{wanted}'"))


def _model_check() -> _Check:
    # _read_setting, not read_settings: a bad TRNLAB_DTYPE must not hide the model's own state.
    name = model_name(_read_setting(_MODEL_ENV_VAR) or _BUNDLED_MODEL_DIR)
    path = Path(name)
    if path.is_dir():
        missing = _missing_model_files(path, "model") + _missing_model_files(path, "tokenizer")
        if missing:
            return _Check("model", False, f"{name} lacks {', '.join(missing)}: rebuild with "
                          "`make model` (python tools/build_model.py) or point TRNLAB_MODEL at a full model folder")
        # The bundled model's folder is a path of this machine: name it the same way everywhere.
        shown = "the bundled tiny Qwen3 (trnlab/assets/tiny-qwen3)" if _is_bundled(name) else name
        return _Check("model", True, f"{shown} (local folder)")
    if _is_bundled(name) or path.is_absolute() or name.startswith("."):
        return _Check("model", False, f"no model folder at {name}: " + (
            "build the course model with `make model` (python tools/build_model.py)" if _is_bundled(name)
            else f"fix {_MODEL_ENV_VAR} or unset it to use the bundled model"))
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return _Check("model", True, f"{name} (in the Hugging Face cache)")
    return _Check("model", False, f"{_MODEL_ENV_VAR}={name} is neither a local folder nor in the "
                  f"Hugging Face cache: pre-download it (`hf download {name}`) or unset {_MODEL_ENV_VAR}")


def _device_check(report: DeviceReport) -> _Check | None:
    try:
        requested = _read_setting(_DEVICE_ENV_VAR)
    except SettingError:
        return None  # reported by the settings check, with the valid forms
    try:
        device = pick_device(requested, verbose=False)
    except (NotAvailableError, ValueError) as exc:
        return _Check("device", False, f"{_DEVICE_ENV_VAR}={requested}: {exc}")
    return _Check("device", True, f"{device} ({_DEVICE_ENV_VAR}={requested}; "
                  f"{report.device_count} {report.backend} device(s))")


def _cores_check(report: DeviceReport) -> _Check | None:
    """On Trainium: fail when another process holds NeuronCores (``neuron-ls``'s PID column)."""
    if report.neuron_ls is None:
        return None
    holders = _neuron_core_holders(report.neuron_ls, ignore_pids=(os.getpid(), os.getppid()))
    if not holders:
        return _Check("neuron cores", True, "no other process holds a NeuronCore")
    return _Check("neuron cores", False, f"held by {_format_core_holders(holders)}: {_RELEASE_CORES_HINT}")


_NATIVE_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"  # the 2.33 DLAMI's TorchNeuron venv
_ACTIVATE = (f"activate TorchNeuron's venv: `source {_NATIVE_VENV}/bin/activate` (the DLAMI "
             "\"Deep Learning AMI Neuron torch-neuronx 2.14.0\")")
_LNC_VAR = "NEURON_LOGICAL_NC_CONFIG"
_CACHE_DIRS = {"NEFF cache": (_NEFF_CACHE_VAR, _DEFAULT_NEFF_CACHE),
               "debug folder": ("TORCH_NEURONX_DEBUG_DIR", "/tmp/neuron_backend")}
_MIN_FREE_GIB = 20  # trnlab's own threshold, not a Neuron figure (AWS asks for a 512 GB root volume)


@dataclass
class _Machine:
    """The inputs of the Neuron checks: :meth:`gather` reads this machine, tests build their own."""

    versions: dict  # installed torch, torch-neuronx, torch-xla, neuronx-cc ("on PATH" too; None: absent)
    env: dict
    prefix: str = ""
    os_release: str = ""
    dev_neuron: bool = False
    disk: dict = field(default_factory=dict)  # {label: (folder, nearest existing folder, free, total bytes)}
    devices: int = 0  # the neuron device_count()

    def venvs(self) -> set[str]:
        return {self.env.get("VIRTUAL_ENV") or self.prefix, self.prefix}

    def on_neuron(self) -> bool:
        return bool(self.versions.get("torch-neuronx") or self.dev_neuron or
                    any(v.startswith("/opt/aws_neuronx_venv_") for v in self.venvs()))

    @classmethod
    def gather(cls, report: DeviceReport) -> "_Machine":
        found = {name: _installed(name) for name in ("torch", "torch-neuronx", "torch-xla", "neuronx-cc")}
        disk = {}
        for label, (variable, default) in _CACHE_DIRS.items():
            folder = Path(os.environ.get(variable) or default)
            at = next(p for p in (folder, *folder.parents) if os.path.exists(p))
            disk[label] = (str(folder), str(at), shutil.disk_usage(at).free, shutil.disk_usage(at).total)
        found["neuronx-cc"] = found["neuronx-cc"] or ("on PATH" if shutil.which("neuronx-cc") else None)
        release = Path("/etc/os-release")
        return cls(found, dict(os.environ),
                   sys.prefix, release.read_text() if release.is_file() else "", any(Path("/dev").glob("neuron*")),
                   disk, report.device_count if report.backend == "neuron" else 0)


def _installed(name: str) -> str | None:
    """The installed distribution's version, None if absent (the stand-in's ``torch_neuronx`` module is none)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _native(version: str | None) -> bool:
    """torch-neuronx 2.<torch minor, 13 or later>.3.x is TorchNeuron (2.13.3.0, 2.14.3.1, a later 2.15.3.x); the
    XLA-based package's versions start with its whole torch version, 2.9 or older (2.9.0.2.11.19912)."""
    try:
        release = Version(version or "").release
    except InvalidVersion:
        return False
    return len(release) >= 3 and release[0] == 2 and release[1] >= 13 and release[2] == 3


def _install_line(torch_version: str | None) -> str:
    """The Neuron setup guide's line for this torch's family; PyTorch's CPU index keeps a CUDA torch out."""
    family = "2.13" if (torch_version or "").startswith("2.13.") else "2.14"
    return (f'pip install --upgrade "torch-neuronx=={family}.*" "neuronx-cc==2.*" nki --extra-index-url '
            "https://pip.repos.neuron.amazonaws.com --extra-index-url https://download.pytorch.org/whl/cpu")


def _environment_check(m: _Machine) -> _Check | None:
    if not m.on_neuron():
        return None
    neuronx, xla = m.versions.get("torch-neuronx"), m.versions.get("torch-xla")
    signs = [f"torch-neuronx {neuronx} is not TorchNeuron (2.13.3.x or 2.14.3.x)"] * (not _native(neuronx or "2.14.3"))
    signs += [f"torch-xla {xla} is installed"] * bool(xla) + sorted(
        f"{v} is an XLA-based venv" for v in m.venvs() if v.startswith("/opt/aws_neuronx_venv_pytorch"))
    if signs:
        return _Check("neuron environment", False, "; ".join(signs) + ": this is the XLA-based torch-neuronx, not the "
                      "native neuron device (the symptom: under torchrun Transformers warns to \"use the NeuronTrainer "
                      f"from optimum[neuron]\"): {_ACTIVATE}")
    if not neuronx:
        return _Check("neuron environment", False, f"torch-neuronx is not installed: {_ACTIVATE}, or "
                      f"{_install_line(m.versions.get('torch'))}")
    return _Check("neuron environment", True, f"TorchNeuron (the native device): torch-neuronx {neuronx} in {m.prefix}")


def _family_check(m: _Machine) -> _Check | None:
    neuronx, torch_version = m.versions.get("torch-neuronx"), m.versions.get("torch") or "not installed"
    if not _native(neuronx):
        return None
    wanted, pair = ".".join(neuronx.split(".")[:2]) + ".0", f"torch {torch_version} with torch-neuronx {neuronx}"
    if torch_version.split("+")[0] == wanted:
        return _Check("torch family", True, pair)
    return _Check("torch family", False, f"{pair}, which needs torch {wanted}: " + (
        _install_line(torch_version) if torch_version.startswith(("2.13.0", "2.14.0"))
        else f"TorchNeuron exists for torch 2.13.0 and 2.14.0 only: {_ACTIVATE}"))


def _compiler_check(m: _Machine) -> _Check | None:
    if not m.versions.get("torch-neuronx"):
        return None
    if m.versions.get("neuronx-cc"):
        return _Check("neuronx-cc", True, f"the Neuron compiler, {m.versions['neuronx-cc']}")
    return _Check("neuronx-cc", False, "the Neuron compiler, which turns graphs into NEFFs, is not installed, so "
                  f"nothing compiles: {_install_line(m.versions.get('torch'))}")


def _ubuntu_check(m: _Machine) -> _Check | None:
    if not m.on_neuron() or not m.os_release:
        return None
    info = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', m.os_release, flags=re.M))
    name, release = info.get("PRETTY_NAME", "this OS"), info.get("VERSION_ID", "")
    facts = ("the 2.33.0 wheels are for Ubuntu 26.04 only (22.04 and 24.04 wheels were announced for the next release, "
             "not confirmed for 2.34: see its release notes), TorchNeuron's DLAMIs for Ubuntu 24.04 and 26.04; the "
             "Neuron docs mark Ubuntu 22.04 end of support")
    if info.get("ID") != "ubuntu" or release in ("24.04", "26.04") or _native(m.versions.get("torch-neuronx")):
        return _Check("ubuntu", True, f"{name}: {facts}")
    source = ", or build torch-neuronx from source where your release has no wheel for it"
    return _Check("ubuntu", False, f"{name}: {facts}: move to the DLAMI on Ubuntu 24.04 or 26.04"
                  + source * (release == "22.04"))


def _disk_check(m: _Machine) -> _Check | None:
    if not m.on_neuron() or not m.disk:
        return None
    detail = "; ".join(f"{label} {folder}: {_human_bytes(free)} free of {_human_bytes(total)} (at {at})"
                       for label, (folder, at, free, total) in m.disk.items())
    if all(free >= _MIN_FREE_GIB * 2**30 for *_, free, _total in m.disk.values()):
        return _Check("disk", True, detail)
    return _Check("disk", False, f"{detail}: under trnlab's threshold of {_MIN_FREE_GIB} GiB free, and compiled graphs "
                  "fill small disks (trn2/trn3 need a root EBS volume of at least 512 GB): grow the volume, or point "
                  f"{' and '.join(v for v, _ in _CACHE_DIRS.values())} at a larger disk")


def _lnc_check(m: _Machine) -> _Check | None:
    value, visible = m.env.get(_LNC_VAR), m.env.get(VISIBLE_CORES_VAR)
    if not m.on_neuron() and value is None:
        return None
    if (value or "2").strip() not in ("1", "2"):
        return _Check("LNC", False, f"{_LNC_VAR}={value!r}: only 1 or 2 exist (default 2), and the runtime's and the "
                      f"compiler's must match: unset {_LNC_VAR} or set it to 1 or 2")
    lnc = int(value or 2)
    return _Check("LNC", True, f"LNC={lnc}{' (default)' * (value is None)}: device_count() is {m.devices}; at LNC={lnc} "
                  f"a Trainium2 chip shows {8 // lnc} logical cores ({lnc} physical NeuronCore-v3 each), a trn2.3xlarge "
                  f"{8 // lnc}" + f"; {VISIBLE_CORES_VAR}={visible} limits this process to those cores" * bool(visible))


def run_checks(report: DeviceReport, machine: _Machine | None = None) -> list[_Check]:
    """The checks that decide the exit status of ``doctor``."""
    machine = machine or _Machine.gather(report)
    checks = [
        *(_Check(variable, False, message) for variable, message in _setting_problems().items()),  # TRNLAB_*
        _device_check(report),
        _version_check("transformers", report.versions.get("transformers")),
        _version_check("accelerate", report.versions.get("accelerate")),
        _model_check(),
        *(check(machine) for check in (_environment_check, _family_check, _compiler_check, _ubuntu_check,
                                       _disk_check, _lnc_check)),
        _cores_check(report),
    ]
    return [check for check in checks if check is not None]


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _format_report(report: DeviceReport, checks: list[_Check]) -> str:
    """The report and checks as a plain-text table."""
    rows = [("backend", report.backend), ("devices", str(report.device_count)),
            ("bf16 native", "yes" if report.bf16_supported else "no"),
            ("available", ", ".join(f"{b}={'yes' if ok else 'no'}" for b, ok in report.available.items()))]
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
    print(_format_report(report, run_checks(report)))
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
        print(json.dumps({**asdict(report), "checks": [asdict(c) for c in checks],
                          "ok": all(c.ok for c in checks)}, indent=2))
    else:
        print(_format_report(report, checks))
    return 0 if all(c.ok for c in checks) else 1


# The device report: what this machine has (doctor's table; notebook 01 through show_report)

def _neff_cache_summary(path: str | os.PathLike | None = None) -> dict:
    """Where compiled Neuron graphs (NEFFs) are cached, and how many files and bytes are there."""
    path = Path(path or os.environ.get(_NEFF_CACHE_VAR, _DEFAULT_NEFF_CACHE))
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    return {"path": str(path), "exists": path.is_dir(), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


@dataclass
class DeviceReport:
    """Everything notebook 01 and ``python -m trnlab doctor`` show about this machine."""

    backend: str
    device_count: int
    bf16_supported: bool
    available: dict[str, bool]
    versions: dict[str, str | None]
    neuron_env: dict[str, str | None]
    neff_cache: dict
    neuron_ls: str | None
    notes: list[str] = field(default_factory=list)


def device_report() -> DeviceReport:
    """Detect the backend and collect versions, Neuron variables, cache and ``neuron-ls``."""
    available = {b: _backend_available(b) for b in _BACKENDS}
    backend = next(b for b in _BACKENDS if available[b])
    notes = []
    if backend != "neuron":
        notes.append("No Neuron device: torch.neuron is absent, so the course runs for real on "
                     f"{backend} (torch.compile stands in for the neuron compiler).")
    # The Neuron runtime and compiler variables that change what a process sees or builds.
    neuron_env = {name: os.environ.get(name) for name in (VISIBLE_CORES_VAR, "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS")}
    return DeviceReport(backend, _device_count(backend), _bf16_supported(backend), available, _package_versions(),
                        neuron_env, _neff_cache_summary(), _neuron_ls_output(), notes)
