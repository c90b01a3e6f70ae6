"""``python -m trnlab doctor``: can the course run on this machine, and if not, why not.
Prints the device report and a list of checks (``--json``: as JSON); exit status 0 when every check passes."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

import torch

from trnlab import _compat
from trnlab.device import (_BACKENDS, _DEFAULT_NEFF_CACHE, _INSTALL_HINTS, _NEFF_CACHE_VAR, _RELEASE_CORES_HINT,
                           _backend_available, _bf16_supported, _device_count, _format_core_holders, _human_bytes,
                           _neuron_ls_devices, _neuron_ls_json, _neuron_ls_output, _package_versions)
from trnlab.launcher import INSTANCES
from trnlab.models import (_BUNDLED_MODEL_DIR, _MODEL_ENV_VAR, _WEIGHT_PATTERNS, _is_bundled, _missing_model_files,
                           model_name)
from trnlab.rank_cores import _VISIBLE_CORES_VAR as VISIBLE_CORES_VAR, _parse_core_list
from trnlab.run_record import _installed, newer_than_tested
from trnlab.settings import _DEVICE_ENV_VAR, SettingError, _read_setting, _setting_problems

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


def _chosen_model() -> str:
    """The model this machine would load; _read_setting, not read_settings: a bad TRNLAB_DTYPE must not hide it."""
    return model_name(_read_setting(_MODEL_ENV_VAR) or _BUNDLED_MODEL_DIR)


def _model_check() -> _Check | None:
    try:
        name = _chosen_model()
    except SettingError:
        return None  # reported by the settings check
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
    """TRNLAB_DEVICE against the report, not torch asked again: :func:`device_report` may have asked it apart."""
    try:
        requested = _read_setting(_DEVICE_ENV_VAR)
    except SettingError:
        return None  # reported by the settings check, with the valid forms
    backend, _, index = requested.partition(":")
    backend = report.backend if backend == "auto" else backend
    count = report.device_count if backend == report.backend else None
    if not report.available.get(backend):
        problem = f"{backend} was requested but is not available. {_INSTALL_HINTS[backend]}"
    elif index and count is not None and int(index) >= count:
        problem = (f"{requested} was requested but this process sees {count} {backend} device(s): use an index "
                   f"from 0 to {count - 1}.")
    else:
        device = "cpu" if backend == "cpu" else f"{backend}:0" if requested == "auto" else requested
        return _Check("device", True, f"{device} ({_DEVICE_ENV_VAR}={requested}; "
                      f"{report.device_count} {report.backend} device(s))")
    return _Check("device", False, f"{_DEVICE_ENV_VAR}={requested}: {problem}")


def _cores_check(m: _Machine) -> _Check | None:
    """Where neuron-ls exists: fail when another process holds NeuronCores (its JSON's processes, or PID column)."""
    if m.neuron_ls is None:
        return None
    holders = [(pid, cmd) for pid, cmd in m.neuron_ls["holders"] if pid not in (os.getpid(), os.getppid())]
    if not holders:
        return _Check("neuron cores", True, "no other process holds a NeuronCore")
    return _Check("neuron cores", False, f"held by {_format_core_holders(holders)}: {_RELEASE_CORES_HINT}")


_NATIVE_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"  # the 2.33 DLAMI's TorchNeuron venv
_ACTIVATE = (f"activate TorchNeuron's venv: `source {_NATIVE_VENV}/bin/activate` (the DLAMI "
             "\"Deep Learning AMI Neuron torch-neuronx 2.14.0\")")
_LNC_VAR = "NEURON_LOGICAL_NC_CONFIG"
#: The folders compiling writes to: {label: (variable, default)}; no default: only where the variable is set.
_CACHE_DIRS = {"NEFF cache": (_NEFF_CACHE_VAR, _DEFAULT_NEFF_CACHE),
               "local NEFF cache": ("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", None),
               "debug folder": ("TORCH_NEURONX_DEBUG_DIR", "/tmp/neuron_backend")}
_ROOT = "root volume"
_MIN_FREE_GIB = 20  # trnlab's own threshold, not a Neuron figure (AWS asks for a 512 GB root volume)
_MIN_ROOT_BYTES = 512 * 10**9  # "a root EBS volume of at least 512 GB" (Neuron setup guide, trn2/trn3)


@dataclass
class _Machine:
    """The inputs of the Neuron checks: :meth:`gather` reads this machine, tests build their own."""

    versions: dict  # installed torch, torch-neuronx, torch-xla, neuronx-cc ("on PATH" too; None: absent)
    env: dict
    prefix: str = ""
    os_release: str = ""
    dev_neuron: bool = False
    disk: dict = field(default_factory=dict)  # {label: (folder, nearest existing folder, free, total bytes, fs type)}
    devices: int = 0  # the neuron device_count()
    python: tuple = field(default_factory=lambda: tuple(sys.version_info[:2]))
    torch_neuron: bool = False  # torch has its `neuron` module
    privateuse1: str = "privateuseone"  # the name of PyTorch's out-of-tree backend
    neuron_ls: dict | None = None  # _neuron_ls_devices() where neuron-ls exists
    memory: tuple | None = None  # (available, total) host memory in bytes
    weights: tuple | None = None  # (the chosen model, bytes of its weight files)
    oom_kills: list | None = None  # the kernel log's OOM kills ("neuronx-cc (PID 42)"); None: no log could be read

    def venvs(self) -> set[str]:
        return {self.env.get("VIRTUAL_ENV") or self.prefix, self.prefix}

    def on_neuron(self) -> bool:
        return bool(self.versions.get("torch-neuronx") or self.dev_neuron or
                    any(v.startswith("/opt/aws_neuronx_venv_") for v in self.venvs()))

    @classmethod
    def gather(cls, report: DeviceReport) -> "_Machine":
        found = {name: _installed(name) for name in ("torch", "torch-neuronx", "torch-xla", "neuronx-cc")}
        found["neuronx-cc"] = found["neuronx-cc"] or ("on PATH" if shutil.which("neuronx-cc") else None)
        release = Path("/etc/os-release")
        machine = cls(found, dict(os.environ), sys.prefix, release.read_text() if release.is_file() else "",
                      any(Path("/dev").glob("neuron*")), _disk(),
                      report.device_count if report.backend == "neuron" else 0,
                      torch_neuron=getattr(torch, "neuron", None) is not None,
                      privateuse1=_compat.privateuse1_backend_name())
        if report.neuron_ls is not None:  # neuron-ls exists: its JSON where it has one, and the text for the header
            machine.neuron_ls = _neuron_ls_devices(_neuron_ls_json(), report.neuron_ls)
        if machine.on_neuron():  # read on Trainium only: the kernel log and the model's files take time
            machine.memory, machine.weights, machine.oom_kills = _memory(), _model_weights(), _oom_kills()
        return machine


def _disk() -> dict:
    """:attr:`_Machine.disk`: each folder compiling writes to (:data:`_CACHE_DIRS`) and the root volume."""
    disk = {}
    for label, (variable, default) in {**_CACHE_DIRS, _ROOT: (None, "/")}.items():
        folder = Path(os.environ.get(variable or "") or default or "")
        if str(folder) in ("", "."):
            continue
        at = next(p for p in (folder, *folder.parents) if os.path.exists(p))
        usage = shutil.disk_usage(at)
        disk[label] = (str(folder), str(at), usage.free, usage.total, _filesystem(at))
    return disk


def _filesystem(path) -> str:
    """The type of the filesystem ``path`` is on (``"tmpfs"``, ``"ext4"``...), from /proc/mounts; "" if unknown."""
    mounts = Path("/proc/mounts")
    entries = [line.split()[1:3] for line in mounts.read_text().splitlines()] if mounts.is_file() else []
    path = str(Path(path).resolve())
    under = [(point, kind) for point, kind in entries if path == point or path.startswith(point.rstrip("/") + "/")]
    return max(under, key=lambda entry: len(entry[0]), default=("", ""))[1]


def _memory() -> tuple | None:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo; None where there is none."""
    meminfo = Path("/proc/meminfo")
    values = dict(re.findall(r"^(\w+):\s+(\d+) kB", meminfo.read_text(), flags=re.M)) if meminfo.is_file() else {}
    return (int(values["MemAvailable"]) * 1024, int(values["MemTotal"]) * 1024) if "MemAvailable" in values else None


def _model_weights() -> tuple | None:
    """(the chosen model, bytes of its weight files) where they are on this machine: its folder or the HF cache."""
    try:
        name = _chosen_model()
    except SettingError:
        return None
    folder = Path(name)
    if not folder.is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        folder = Path(cached).parent if isinstance(cached, str) else None
    files = {f for pattern in _WEIGHT_PATTERNS if folder for f in folder.glob(pattern) if not f.name.endswith(".json")}
    return (name, sum(f.stat().st_size for f in files)) if files else None


_KERNEL_LOG = Path("/var/log/kern.log")  # where Ubuntu keeps the kernel log when dmesg needs root


def _oom_kills() -> list[str] | None:
    """The processes the kernel's OOM killer ended since boot, from ``dmesg`` or :data:`_KERNEL_LOG`; None: neither
    can be read (``dmesg`` often needs root)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
        log = done.stdout if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        log = None
    if log is None:
        try:
            log = _KERNEL_LOG.read_text(errors="replace")[-4_000_000:]
        except OSError:
            return None
    return [f"{command} (PID {pid})" for pid, command in re.findall(r"Killed process (\d+) \(([^)]*)\)", log)]


def _native(version: str | None) -> bool:
    """torch-neuronx 2.<torch minor, 13 or later>.3.x is TorchNeuron (2.13.3.0, 2.14.3.1, a later 2.15.3.x); the
    XLA-based package's versions start with its whole torch version, 2.9 or older (2.9.0.2.11.19912)."""
    try:
        release = Version(version or "").release
    except InvalidVersion:
        return False
    return len(release) >= 3 and release[0] == 2 and release[1] >= 13 and release[2] == 3


def _install_line(torch_version: str | None) -> str:
    """The Neuron setup guide's line for this torch's family, torch pinned (torch-neuronx 2.14.3.x is built against
    2.14.0; PyPI has 2.14.1 and 2.15.0); PyTorch's CPU index keeps a CUDA torch out."""
    family = "2.13" if (torch_version or "").startswith("2.13.") else "2.14"
    return (f'pip install --upgrade "torch=={family}.0" "torch-neuronx=={family}.*" "neuronx-cc==2.*" nki '
            "--extra-index-url https://pip.repos.neuron.amazonaws.com "
            "--extra-index-url https://download.pytorch.org/whl/cpu")


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
        if Version(neuronx) < Version(wanted[:-1] + "3.1"):  # 2.13.3.1 / 2.14.3.1: Neuron 2.34
            pair += ("; torch.accelerator's memory functions work on Neuron from torch-neuronx 2.13.3.1 / 2.14.3.1 "
                     "(Neuron 2.34 release notes): before, notebook 02's memory figures may be missing or wrong")
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


def _python_check(m: _Machine) -> _Check | None:
    if not m.versions.get("torch-neuronx"):
        return None
    version = ".".join(map(str, m.python))
    if (3, 12) <= tuple(m.python) <= (3, 14):
        return _Check("python", True, f"Python {version}: TorchNeuron has wheels for Python 3.12, 3.13 and 3.14")
    return _Check("python", False, f"Python {version} with torch-neuronx installed, but TorchNeuron has wheels for "
                  f"Python 3.12, 3.13 and 3.14 only: {_ACTIVATE}, or make a venv with one of those")


def _autoload_check(m: _Machine) -> _Check | None:
    """TorchNeuron installed, but is ``torch.neuron`` there? PyTorch autoloads it unless told not to or taken."""
    if not _native(m.versions.get("torch-neuronx")):
        return None
    if m.torch_neuron:
        return _Check("torch.neuron", True, "registered: TorchNeuron loaded with torch")
    if m.env.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "").strip() == "0":
        why = ("TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps PyTorch from loading TorchNeuron: unset it, or `import "
               "torch_neuronx` first (the torch.neuron reference: only then is the import needed)")
    elif m.privateuse1 not in ("privateuseone", "neuron"):
        why = (f"PyTorch's out-of-tree backend (PrivateUse1) is already named {m.privateuse1!r}: another package "
               "registered its device first, and the name is given once per process: uninstall that package, or keep "
               "it from loading before torch_neuronx")
    else:
        why = "`python -c 'import torch_neuronx'` shows why it does not load"
    return _Check("torch.neuron", False, f"torch has no neuron device although torch-neuronx "
                  f"{m.versions['torch-neuronx']} is installed: {why}")


def _disk_check(m: _Machine) -> _Check | None:
    if not m.on_neuron() or not m.disk:
        return None
    detail = "; ".join(f"{label} {folder}: {_human_bytes(free)} free of {_human_bytes(total)} (at {at}"
                       + ", tmpfs: in memory" * (kind == "tmpfs") + ")"
                       for label, (folder, at, free, total, kind) in m.disk.items())
    caches = {label: entry for label, entry in m.disk.items() if label != _ROOT}
    variables = " and ".join(_CACHE_DIRS[label][0] for label in caches)
    fixes = []
    if m.disk.get(_ROOT) and m.disk[_ROOT][3] < _MIN_ROOT_BYTES:
        fixes.append(f"the root volume is {m.disk[_ROOT][3] / 10**9:.0f} GB ({_human_bytes(m.disk[_ROOT][3])}), and "
                     "trn2/trn3 need a root EBS volume of at least 512 GB (Neuron setup guide): grow it")
    if any(free < _MIN_FREE_GIB * 2**30 for _, _, free, _, _ in caches.values()):
        fixes.append(f"under trnlab's threshold of {_MIN_FREE_GIB} GiB free, and compiled graphs fill small disks: "
                     f"grow the volume, or point {variables} at a larger disk")
    if in_memory := [label for label, entry in caches.items() if entry[4] == "tmpfs"]:
        fixes.append(f"{' and '.join(in_memory)} on tmpfs, which lives in host memory: gone at each reboot, and "
                     f"taken from the memory compiling needs: point {variables} at a folder on disk")
    return _Check("disk", not fixes, "; ".join([detail, *fixes]) if fixes else detail)


#: trnlab's own rule of thumb for the host memory a compile takes, as (times the weights, plus GiB): no figure is
#: published, and compiles killed for host memory are a common report (aws-neuron-sdk#431, #706).
_COMPILE_MEMORY = (4, 8)


def _memory_check(m: _Machine) -> _Check | None:
    if not m.on_neuron() or m.memory is None:
        return None
    (available, total), (times, plus) = m.memory, _COMPILE_MEMORY
    detail = f"{_human_bytes(available)} available of {_human_bytes(total)}"
    need = m.weights and times * m.weights[1] + plus * 2**30
    if need:
        detail += (f"; compiling {m.weights[0]} takes about {_human_bytes(need)} by trnlab's own rule of thumb "
                   f"({times} x its {_human_bytes(m.weights[1])} of weights + {plus} GiB: no figure is published)")
    fix = ("use an instance with more host memory or a smaller model, or end the processes (other notebooks' kernels) "
           "that hold memory")
    if m.oom_kills:
        return _Check("host memory", False, f"{detail}; the kernel log shows the OOM killer ended "
                      f"{', '.join(m.oom_kills[-3:])} since boot, as in compiles killed for host memory "
                      f"(aws-neuron-sdk#431, #706): {fix}")
    if need and available < need:
        return _Check("host memory", False, f"{detail}: {fix}")
    return _Check("host memory", True, detail + ("; no OOM kill in the kernel log" if m.oom_kills is not None else
                                                 "; the kernel log could not be read for OOM kills (`sudo dmesg | "
                                                 "grep -i 'killed process'` reads it)"))


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


def _compiler_lnc_check(m: _Machine) -> _Check | None:
    """``--lnc``/``--logical-nc-config`` in NEURON_CC_FLAGS against the runtime's NEURON_LOGICAL_NC_CONFIG."""
    flags = m.env.get("NEURON_CC_FLAGS") or ""
    found = re.search(r"(?:^|\s)(--lnc|-lnc|--logical-nc-config)(?:=|\s+)(\S+)", flags)
    if found is None or not m.on_neuron():
        return None
    runtime = (m.env.get(_LNC_VAR) or "2").strip()
    said = f"NEURON_CC_FLAGS has {found.group(1)} {found.group(2)}, {_LNC_VAR} is {runtime}" + " (default)" * (
        m.env.get(_LNC_VAR) is None)
    if found.group(2) == runtime:
        return _Check("compiler LNC", True, f"{said}: they match")
    return _Check("compiler LNC", False, f"{said}: the runtime's and the compiler's LNC must match: set {_LNC_VAR}="
                  f"{found.group(2)}, or drop {found.group(1)} from NEURON_CC_FLAGS")


def _visible_count(env: dict) -> tuple[int, str] | None:
    """How many NeuronCores NEURON_RT_VISIBLE_CORES or NEURON_RT_NUM_CORES give this process, and which said so."""
    if (cores := (env.get(VISIBLE_CORES_VAR) or "").strip()):
        return len(_parse_core_list(cores)), f"{VISIBLE_CORES_VAR}={cores}"
    if (number := (env.get("NEURON_RT_NUM_CORES") or "").strip()).isdigit():
        return int(number), f"NEURON_RT_NUM_CORES={number}"
    return None


def _device_count_check(m: _Machine) -> _Check | None:
    """device_count() against what neuron-ls shows: the instance type's chips and its logical-neuroncore-config."""
    shown = m.neuron_ls
    if not shown or not shown["cores"] or not m.devices:
        return None
    lnc, instance = shown["lnc"], INSTANCES.get(shown["instance_type"] or "")
    cores = instance.chips * instance.physical_cores_per_chip // lnc if instance and lnc else sum(shown["cores"])
    said = (f"neuron-ls: {shown['instance_type'] or 'this machine'}, {len(shown['cores'])} devices, "
            f"{sum(shown['cores'])} logical NeuronCores" + f" at logical-neuroncore-config {lnc}" * bool(lnc))
    if instance and lnc:
        said += f" ({instance.chips} chips x {instance.physical_cores_per_chip} physical / {lnc}: {cores})"
    try:
        limit = _visible_count(m.env)
    except SettingError as exc:
        return _Check("device count", False, str(exc))
    wanted, why = limit or (cores, "every core")
    if m.devices == wanted and (not instance or not lnc or sum(shown["cores"]) == cores):
        return _Check("device count", True, f"device_count() is {m.devices} ({why}); {said}")
    return _Check("device count", False, f"device_count() is {m.devices}, expected {wanted} ({why}); {said}: set "
                  f"{_LNC_VAR} (here {m.env.get(_LNC_VAR) or 'unset: 2'}), {VISIBLE_CORES_VAR} and NEURON_RT_NUM_CORES "
                  "to what this process should use before it starts, and run doctor again")


def _torchrun_check(m: _Machine) -> _Check | None:
    """What a shell hands torchrun's ranks: a many-core NEURON_RT_VISIBLE_CORES, a NEURON_RT_ROOT_COMM_ID."""
    if not m.on_neuron():
        return None
    cores, root = (m.env.get(VISIBLE_CORES_VAR) or "").strip(), (m.env.get("NEURON_RT_ROOT_COMM_ID") or "").strip()
    notes, ok = [], True
    if cores:
        try:
            count = len(_parse_core_list(cores))
        except SettingError as exc:
            return _Check("torchrun", False, str(exc))
        in_rank = bool(m.env.get("LOCAL_RANK"))
        if count > 1:
            ok = not in_rank
            notes.append(f"{VISIBLE_CORES_VAR}={cores} gives " + ("this rank" if in_rank else "one process (a notebook "
                         "kernel) those cores, but under a plain torchrun it gives every rank") + f" all {count}, and "
                         "TorchNeuron asserts one core per rank: start the ranks with `torchrun --nproc-per-node="
                         f"{count} -m trnlab.rank_cores {cores} train.py` (one core each), or trnlab.launch(script), "
                         f"which does it; or unset {VISIBLE_CORES_VAR} to use every core")
    if root:
        notes.append(f"NEURON_RT_ROOT_COMM_ID={root} is set here, and every process started from this shell inherits "
                     "it, torchrun's ranks too: if a run before this one left it, `unset NEURON_RT_ROOT_COMM_ID`")
    return _Check("torchrun", ok, "; ".join(notes)) if notes else None


def run_checks(report: DeviceReport, machine: _Machine | None = None) -> list[_Check]:
    """The checks that decide the exit status of ``doctor``."""
    machine = machine or _Machine.gather(report)
    checks = [
        *(_Check(variable, False, message) for variable, message in _setting_problems().items()),  # TRNLAB_*
        _device_check(report),
        _version_check("transformers", report.versions.get("transformers")),
        _version_check("accelerate", report.versions.get("accelerate")),
        _model_check(),
        *(_Check("tested versions", True, warning) for warning in newer_than_tested(report.versions)),
        *(check(machine) for check in (_environment_check, _family_check, _python_check, _autoload_check,
                                       _compiler_check, _ubuntu_check, _disk_check, _memory_check, _lnc_check,
                                       _compiler_lnc_check, _device_count_check, _torchrun_check, _cores_check)),
    ]
    return [check for check in checks if check is not None]


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


def _device_facts() -> dict:
    """What the report asks torch: each backend's availability, and the best one's device count and bf16."""
    available = {b: _backend_available(b) for b in _BACKENDS}
    backend = next(b for b in _BACKENDS if available[b])
    return {"available": available, "backend": backend, "count": _device_count(backend),
            "bf16": _bf16_supported(backend)}


#: The child process of :func:`_ask_torch`: :func:`_device_facts` as one line of JSON.
_ASK_TORCH = "import json; from trnlab.doctor import _device_facts; print(json.dumps(_device_facts()))"


def _ask_torch(apart: bool) -> tuple[dict, str | None]:
    """:func:`_device_facts`, ``apart`` in a child process: TorchNeuron asserts that the Neuron runtime was not
    started before ``init_process_group``, so doctor must not start it in its caller; the note says where torch ran."""
    if not apart:
        return _device_facts(), None
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    done = None
    try:
        done = subprocess.run([sys.executable, "-c", _ASK_TORCH], capture_output=True, text=True, env=env, timeout=300)
        return json.loads(done.stdout.strip().splitlines()[-1]), (
            "doctor asked torch for the devices in a child process: this process has not started the Neuron runtime")
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        why = (done.stderr.strip().splitlines() or [""])[-1] if done is not None else ""
        return _device_facts(), (f"asking torch in a child process failed ({why or exc}), so doctor asked it in this "
                                 "process, which may have started the Neuron runtime here: init_process_group would "
                                 "then fail TorchNeuron's assertion in this process; run `python -m trnlab doctor` on "
                                 "its own")


def device_report() -> DeviceReport:
    """Detect the backend and collect versions, Neuron variables, cache and ``neuron-ls``. Where torch-neuronx is
    installed, torch is asked in a child process (:func:`_ask_torch`): doctor does not start the Neuron runtime."""
    facts, ran_apart = _ask_torch(apart=_installed("torch-neuronx") is not None)
    backend = facts["backend"]
    notes = [ran_apart] if ran_apart else []
    if backend != "neuron":
        notes.append("No Neuron device: torch.neuron is absent, so the course runs for real on "
                     f"{backend} (torch.compile stands in for the neuron compiler).")
    # The Neuron runtime and compiler variables that change what a process sees or builds.
    neuron_env = {name: os.environ.get(name) for name in (VISIBLE_CORES_VAR, "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS")}
    return DeviceReport(backend, facts["count"], facts["bf16"], facts["available"], _package_versions(),
                        neuron_env, _neff_cache_summary(), _neuron_ls_output(), notes)
