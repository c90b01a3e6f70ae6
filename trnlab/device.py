"""Which accelerator this process can use, and how to hand it to Transformers.
Preference: ``neuron`` (TorchNeuron, from ``torch-neuronx``, autoloads with torch) > ``cuda`` > ``cpu``; detection asks
``torch.accelerator`` first, then the backend modules."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trnlab import __version__
from trnlab.rank_cores import VISIBLE_CORES_VAR, visible_cores_setting
from trnlab.settings import DEVICE_CHOICES, check_dtype_name, read_settings

__all__ = ["BACKENDS", "NEURON_ENV_VARS", "NEFF_CACHE_VAR", "DEFAULT_NEFF_CACHE", "INSTALL_HINTS",
           "AUTO_ON_NEURON_WARNING", "DeviceNotAvailableError", "neuron_module", "current_accelerator",
           "backend_available", "detect_backend", "device_count", "bf16_supported", "package_versions",
           "neff_cache_summary", "neuron_ls_output", "neuron_core_holders", "format_core_holders",
           "DeviceReport", "device_report", "pick_device", "resolve_dtype", "resolve_device_map",
           "accelerator_memory", "format_accelerator_memory", "RELEASE_CORES_HINT", "core_holders_notice"]

#: Device types trnlab knows, in the order :func:`detect_backend` tries them.
BACKENDS = DEVICE_CHOICES

#: Neuron runtime and compiler variables that change what a process sees or builds.
NEURON_ENV_VARS = (VISIBLE_CORES_VAR, "NEURON_RT_NUM_CORES", "NEURON_CC_FLAGS")
#: Environment variable naming torch-neuronx's compiled-graph (NEFF) cache folder.
NEFF_CACHE_VAR = "TORCH_NEURONX_NEFF_CACHE_DIR"
#: The NEFF cache folder when :data:`NEFF_CACHE_VAR` is unset.
DEFAULT_NEFF_CACHE = "/tmp/neff_cache"

#: What to install for each device type, by backend name (in messages).
INSTALL_HINTS = {
    "neuron": (
        "torch-neuronx is not installed or sees no NeuronCore. The native neuron device "
        "(TorchNeuron) runs on trn2 and trn3 instances only, with torch 2.13/2.14 and Python "
        "3.12-3.14: install the torch-neuronx that matches your torch (2.13.3.x for torch 2.13.0, "
        "2.14.3.x for 2.14.0) from the AWS Neuron package repository as the AWS Neuron setup "
        "guide shows, never the placeholder of the same name on the public index. trn1 has no "
        "native neuron device (it keeps the older XLA-based torch-neuronx). Or use "
        "TRNLAB_DEVICE=auto to fall back to CUDA or CPU."
    ),
    "cuda": (
        "PyTorch sees no CUDA GPU: this torch build is CPU-only or no GPU/driver is present. "
        "Install a CUDA build of torch on a GPU machine, or use TRNLAB_DEVICE=auto to fall back to CPU."
    ),
}

#: Accelerate's ``device_map="auto"`` cannot enumerate NeuronCores: the page's warning, word for word in spirit.
AUTO_ON_NEURON_WARNING = (
    "device_map='auto' does not see Neuron: Accelerate cannot enumerate neuron devices, so "
    "from_pretrained would load the model silently on CPU. Using device_map='neuron' instead; "
    "pass device_map='neuron' yourself to silence this warning."
)


class DeviceNotAvailableError(RuntimeError):
    """An explicitly requested device does not exist on this machine."""


def neuron_module():
    """Return ``torch.neuron`` (TorchNeuron registers it when torch loads), or ``None``.
    Older torch-neuronx builds registered it on ``import torch_neuronx``: that is tried too."""
    if getattr(torch, "neuron", None) is None:
        try:
            importlib.import_module("torch_neuronx")
        except ImportError:
            return None
    return getattr(torch, "neuron", None)


def current_accelerator() -> str | None:
    """The device type ``torch.accelerator`` reports ("neuron", "cuda", ...), or ``None``.
    ``None`` also on a torch without ``torch.accelerator`` (before 2.6): the backend modules decide then."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None
    found = accelerator.current_accelerator()
    return found.type if found is not None else None


def backend_available(backend: str) -> bool:
    """True when ``backend`` ("neuron", "cuda" or "cpu") has at least one device here."""
    if backend == "cpu":
        return True
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if current_accelerator() == backend:
        return True
    if backend == "neuron":
        module = neuron_module()
        return bool(module is not None and module.is_available())
    return torch.cuda.is_available()


def detect_backend() -> str:
    """The best backend this process can use: ``"neuron"``, ``"cuda"`` or ``"cpu"``.
    ``torch.accelerator`` answers first where torch has it; ``torch.neuron`` and ``torch.cuda`` otherwise."""
    accelerator = current_accelerator()
    if accelerator in BACKENDS:
        return accelerator
    return next(b for b in BACKENDS if backend_available(b))


def device_count(backend: str | None = None) -> int:
    """How many devices of ``backend`` (default: the detected one) this process sees."""
    backend = backend or detect_backend()
    if not backend_available(backend):
        return 0
    if current_accelerator() == backend:
        return int(torch.accelerator.device_count())
    if backend == "neuron":
        return int(neuron_module().device_count())
    if backend == "cuda":
        return torch.cuda.device_count()
    return 1


def bf16_supported(backend: str | None = None) -> bool:
    """Whether ``backend`` computes in bfloat16 natively (every Trainium generation does)."""
    backend = backend or detect_backend()
    if not backend_available(backend):
        return False
    if backend == "neuron":
        check = getattr(neuron_module(), "is_bf16_supported", None)
        return bool(check()) if check is not None else True
    if backend == "cuda":
        return torch.cuda.is_bf16_supported()
    # The course counts no CPU as native: it trains there in the dtype the weights were loaded in.
    return False


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages the course depends on (``None``: not installed)."""
    versions = {name: _version(name) for name in ("torch", "transformers", "accelerate")}
    neuronx = _version("torch-neuronx")
    loaded = sys.modules.get("torch_neuronx")
    if neuronx is None and loaded is not None:
        neuronx = getattr(loaded, "__version__", "unknown")
    versions["torch-neuronx"] = neuronx
    versions["trnlab"] = __version__
    return versions


def neff_cache_summary(path: str | os.PathLike | None = None) -> dict:
    """Where compiled Neuron graphs (NEFFs) are cached, and how many files and bytes are there."""
    path = Path(path or os.environ.get(NEFF_CACHE_VAR, DEFAULT_NEFF_CACHE))
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
    return {"path": str(path), "exists": path.is_dir(), "files": len(files),
            "bytes": sum(p.stat().st_size for p in files)}


def neuron_ls_output(timeout: float = 20.0) -> str | None:
    """The output of ``neuron-ls`` where that program exists, else ``None``."""
    program = shutil.which("neuron-ls")
    if program is None:
        return None
    try:
        done = subprocess.run([program], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"neuron-ls failed: {exc}"
    return (done.stdout + done.stderr).strip()


def neuron_core_holders(neuron_ls_text: str | None, ignore_pids: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """``(pid, command)`` of every process ``neuron-ls`` lists as using a Neuron device.
    A process holds every NeuronCore it sees until it exits. Empty when the text has no ``PID``/``COMMAND`` columns;
    ``ignore_pids`` (e.g. this process) are left out."""
    if not neuron_ls_text:
        return []
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in neuron_ls_text.splitlines() if line.strip().startswith("|")]
    header = next((row for row in rows if "PID" in row), None)
    if header is None:
        return []
    pid_at = header.index("PID")
    command_at = header.index("COMMAND") if "COMMAND" in header else None
    holders = []
    for row in rows:
        if len(row) == len(header) and row[pid_at].isdigit() and int(row[pid_at]) not in ignore_pids:
            holders.append((int(row[pid_at]), row[command_at] if command_at is not None else ""))
    return holders


def format_core_holders(holders: list[tuple[int, str]]) -> str:
    """``"PID 4242 (python -m ipykernel_launcher); PID ..."``: :func:`neuron_core_holders` for a message."""
    return "; ".join(f"PID {pid} ({command or 'unknown command'})" for pid, command in holders)


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

    def to_dict(self) -> dict:
        return asdict(self)


def device_report() -> DeviceReport:
    """Detect the backend and collect versions, Neuron variables, cache and ``neuron-ls``."""
    available = {b: backend_available(b) for b in BACKENDS}
    backend = next(b for b in BACKENDS if available[b])
    notes = []
    if backend != "neuron":
        notes.append("No Neuron device: torch.neuron is absent, so the course runs for real on "
                     f"{backend} (torch.compile stands in for the neuron compiler).")
    return DeviceReport(
        backend=backend,
        device_count=device_count(backend),
        bf16_supported=bf16_supported(backend),
        available=available,
        versions=package_versions(),
        neuron_env={name: os.environ.get(name) for name in NEURON_ENV_VARS},
        neff_cache=neff_cache_summary(),
        neuron_ls=neuron_ls_output(),
        notes=notes,
    )


def pick_device(prefer: str | torch.device | None = None, verbose: bool = True) -> torch.device:
    """Return the device to use, like d2l's ``try_gpu()`` but for neuron > cuda > cpu.
    ``prefer=None`` reads ``TRNLAB_DEVICE`` (default ``"auto"``: the best device, saying why). An explicit choice such as
    ``"neuron:3"`` that does not exist raises :class:`DeviceNotAvailableError`: it never falls back silently."""
    if prefer is None:
        prefer = read_settings().device
    if isinstance(prefer, torch.device):
        prefer = str(prefer)
    prefer = (prefer or "auto").strip().lower()
    if prefer == "auto":
        backend = detect_backend()
        if verbose and backend != "neuron":
            missing = [b for b in BACKENDS[: BACKENDS.index(backend)]]
            reasons = {"neuron": "no neuron device (TorchNeuron is not installed here: it runs on trn2/trn3)",
                       "cuda": "no CUDA GPU"}
            print(f"Using {backend}: " + "; ".join(reasons[b] for b in missing) + ".")
        elif verbose:
            standin = getattr(neuron_module(), "standin", False)  # trnlab's stand-in says what it is
            print(f"Using neuron: {device_count('neuron')} NeuronCore(s) visible" +
                  (f" ({neuron_module().__doc__})." if standin else "."))
        return torch.device(backend, 0) if backend != "cpu" else torch.device("cpu")

    backend, _, index = prefer.partition(":")
    if backend not in BACKENDS:
        raise ValueError(f"unknown device {prefer!r}: use 'auto' or one of {', '.join(BACKENDS)}, "
                         "optionally with an index (e.g. 'neuron:3')")
    if not backend_available(backend):
        raise DeviceNotAvailableError(f"{backend} was requested but is not available. {INSTALL_HINTS[backend]}")
    if index:
        count = device_count(backend)
        if not index.isdigit() or int(index) >= count:
            raise DeviceNotAvailableError(
                f"{prefer} was requested but this process sees {count} {backend} device(s): "
                f"use an index from 0 to {count - 1}.")
    return torch.device(prefer) if backend != "cpu" else torch.device("cpu")


def resolve_dtype(dtype: torch.dtype | str | None = None, device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype to load a model in on ``device``.
    ``dtype=None`` reads ``TRNLAB_DTYPE`` (default ``"auto"``: bfloat16 where the device computes it natively, every
    Trainium generation and recent GPUs, else float32); ``"float32"``, ``"bfloat16"`` or a ``torch.dtype`` as given."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = read_settings().dtype if dtype is None else check_dtype_name(dtype)
    if name == "auto":
        return torch.bfloat16 if bf16_supported(torch.device(device).type) else torch.float32
    return getattr(torch, name)


def resolve_device_map(device_map="auto", backend: str | None = None):
    """Return the ``device_map`` that ``from_pretrained`` should get on this machine.
    On Neuron ``"auto"`` becomes ``"neuron"`` with a warning (Accelerate would silently load on CPU); on CPU ``"cpu"``;
    explicit devices are checked to exist. ``backend`` overrides detection."""
    if device_map is None or isinstance(device_map, dict):
        return device_map
    if isinstance(device_map, torch.device):
        device_map = str(device_map)
    backend = backend or detect_backend()
    if device_map == "auto":
        if backend == "neuron":
            warnings.warn(AUTO_ON_NEURON_WARNING, UserWarning, stacklevel=2)
            return "neuron"
        return "auto" if backend == "cuda" else "cpu"
    requested = device_map.split(":")[0]
    if requested in ("neuron", "cuda") and requested != backend and not backend_available(requested):
        raise DeviceNotAvailableError(f"device_map={device_map!r} but {requested} is not available. "
                                      f"{INSTALL_HINTS[requested]}")
    return device_map


def accelerator_memory(device: torch.device | str) -> dict | None:
    """Bytes of device memory held by tensors on ``device`` now and at most so far, or ``None`` on CPU.
    ``{"allocated": ..., "max_allocated": ...}`` from ``torch.accelerator`` (torch >= 2.9: CUDA and Neuron alike)."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "memory_allocated"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.accelerator.memory_allocated: "
                           "upgrade torch to 2.9 or later (the course uses 2.13) to read device memory.")
    if current_accelerator() != device.type:
        raise ValueError(f"{device} is not this process's accelerator ({current_accelerator() or 'none'}): "
                         "torch.accelerator counts memory of the current accelerator only.")
    index = device.index if device.index is not None else accelerator.current_device_index()
    accelerator.synchronize(index)  # Neuron's allocator is asynchronous: read after queued work is done
    return {"allocated": int(accelerator.memory_allocated(index)),
            "max_allocated": int(accelerator.max_memory_allocated(index))}


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


def format_accelerator_memory(device: torch.device | str) -> str:
    """:func:`accelerator_memory` as one line for a notebook; on CPU, a sentence saying there is no counter."""
    device = torch.device(device)
    memory = accelerator_memory(device)
    if memory is None:
        return (f"{device}: the CPU has no such counter (torch.accelerator.memory_allocated counts the memory "
                "of an accelerator, CUDA or Neuron); on CPU, tensors live in this process's ordinary RAM.")
    return (f"{device}: {_mib(memory['allocated'])} allocated by tensors now, {_mib(memory['max_allocated'])} "
            "at most so far (torch.accelerator.memory_allocated / max_memory_allocated)")


#: How to release NeuronCores, said wherever a process is found holding them.
RELEASE_CORES_HINT = (
    "a process, a notebook kernel too, keeps every NeuronCore it sees until it exits, and the next one "
    "then fails with \"Neuron runtime cannot be initialized\". Release them: shut that notebook's kernel "
    "down (Kernel > Shut Down Kernel) or end the process (`kill <PID>`); or run two notebooks at once on "
    "different cores, with NEURON_RT_VISIBLE_CORES set before each kernel starts (e.g. 0-1 and 2-3)")


def core_holders_notice(neuron_ls_text: str | None, backend: str | None = None,
                        own_pid: int | None = None) -> str:
    """What :func:`trnlab.setup` prints about who holds NeuronCores: ``neuron-ls``'s holders and how to free them.
    ``neuron_ls_text`` is :func:`neuron_ls_output` (``None``: no ``neuron-ls``); ``own_pid`` is not named a holder."""
    backend = backend or detect_backend()
    visible = visible_cores_setting()
    if neuron_ls_text is None:
        if backend != "neuron":
            return ("NeuronCores: none on this machine (no neuron-ls, no neuron device). On a trn2, setup() "
                    "lists here the processes that hold NeuronCores and how to release them.")
        return ("NeuronCores: neuron-ls is not on PATH (it comes with the Neuron tools, aws-neuronx-tools), so "
                "setup() cannot tell which process holds them. A notebook kernel keeps every core it sees "
                "until it shuts down: shut down other notebooks' kernels before this one runs.")
    own = os.getpid() if own_pid is None else own_pid
    holders = neuron_core_holders(neuron_ls_text, ignore_pids=(own,))
    sees = (f"this kernel (PID {own}) sees NeuronCores {visible} (NEURON_RT_VISIBLE_CORES)" if visible else
            f"this kernel (PID {own}) will claim every NeuronCore at its first neuron operation")
    if not holders:
        return (f"NeuronCores: no other process holds one (neuron-ls); {sees}. Shut this kernel down when "
                "you are done, so that the next notebook can have them.")
    return (f"NeuronCores: held by {format_core_holders(holders)} (neuron-ls); {sees}. "
            f"{RELEASE_CORES_HINT[0].upper() + RELEASE_CORES_HINT[1:]}.")
