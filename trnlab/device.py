"""Which accelerator this process can use (neuron > cuda > cpu), how to hand it to Transformers, and each notebook's
first and last call: :func:`setup` and :func:`run_summary`."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import warnings

import torch

from trnlab import __version__, _compat
from trnlab.rank_cores import _visible_cores_setting
from trnlab.run_record import _installed, newer_than_tested, record_run
from trnlab.settings import _DEVICE_CHOICES, NotAvailableError, _check, _read_settings

__all__ = ["setup", "run_summary", "detect_backend", "pick_device", "resolve_dtype", "resolve_device_map",
           "format_accelerator_memory", "core_holders_notice"]

#: Device types trnlab knows, in the order :func:`detect_backend` tries them.
_BACKENDS = _DEVICE_CHOICES
#: Environment variable naming torch-neuronx's compiled-graph (NEFF) cache folder.
_NEFF_CACHE_VAR = "TORCH_NEURONX_NEFF_CACHE_DIR"
#: The NEFF cache folder when :data:`_NEFF_CACHE_VAR` is unset.
_DEFAULT_NEFF_CACHE = "/tmp/neff_cache"

#: What to install for each device type, by backend name (in messages).
_INSTALL_HINTS = {
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


def _neuron_module():
    """``torch.neuron`` (TorchNeuron registers it as torch loads; else ``import torch_neuronx`` does), or ``None``."""
    if getattr(torch, "neuron", None) is None:
        with contextlib.suppress(ImportError):
            importlib.import_module("torch_neuronx")
    return getattr(torch, "neuron", None)


def _current_accelerator() -> str | None:
    """The device type ``torch.accelerator`` reports ("neuron", "cuda", ...), or ``None`` (also before torch 2.6)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None
    found = accelerator.current_accelerator()
    return found.type if found is not None else None


def _backend_available(backend: str) -> bool:
    """True when ``backend`` ("neuron", "cuda" or "cpu") has at least one device here."""
    if backend == "cpu":
        return True
    if backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(_BACKENDS)}")
    if _current_accelerator() == backend:
        return True
    if backend == "neuron":
        module = _neuron_module()
        return bool(module is not None and module.is_available())
    return torch.cuda.is_available()


def detect_backend() -> str:
    """The best backend this process can use: ``"neuron"``, ``"cuda"`` or ``"cpu"`` (``torch.accelerator`` first)."""
    accelerator = _current_accelerator()
    if accelerator in _BACKENDS:
        return accelerator
    return next(b for b in _BACKENDS if _backend_available(b))


def _device_count(backend: str) -> int:
    """How many devices of ``backend`` this process sees."""
    if not _backend_available(backend):
        return 0
    if _current_accelerator() == backend:
        return int(torch.accelerator.device_count())
    if backend == "neuron":
        return int(_neuron_module().device_count())
    return torch.cuda.device_count() if backend == "cuda" else 1


def _bf16_supported(backend: str) -> bool:
    """Whether ``backend`` computes in bfloat16 natively (every Trainium generation does)."""
    if not _backend_available(backend):
        return False
    if backend == "neuron":
        check = getattr(_neuron_module(), "is_bf16_supported", None)
        return bool(check()) if check is not None else True
    # The course counts no CPU as native: it trains there in the dtype the weights were loaded in.
    return backend == "cuda" and torch.cuda.is_bf16_supported()


def _package_versions() -> dict[str, str | None]:
    """Installed versions of the packages the course depends on (``None``: not installed)."""
    versions = {name: _installed(name) for name in ("torch", "transformers", "accelerate", "torch-neuronx")}
    loaded = sys.modules.get("torch_neuronx")
    if versions["torch-neuronx"] is None and loaded is not None:
        versions["torch-neuronx"] = getattr(loaded, "__version__", "unknown")
    return {**versions, "trnlab": __version__}


def _neuron_ls_output(timeout: float = 20.0) -> str | None:
    """The output of ``neuron-ls`` where that program exists, else ``None``."""
    program = shutil.which("neuron-ls")
    if program is None:
        return None
    try:
        done = subprocess.run([program], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"neuron-ls failed: {exc}"
    return (done.stdout + done.stderr).strip()


#: neuron-ls's JSON flags, newest first: Neuron's intent notice (2026-10-16) says ``--json-output``/``-j`` go
#: "starting with 2.34" for ``--output-format json``; no 2.34 tools release note confirming it was found.
_NEURON_LS_JSON_FLAGS = (("--output-format", "json"), ("-j",))


def _neuron_ls_json(timeout: float = 20.0) -> str | None:
    """``neuron-ls``'s JSON where the tool has it (:data:`_NEURON_LS_JSON_FLAGS`), else ``None``: read the text then."""
    program = shutil.which("neuron-ls")
    for flags in _NEURON_LS_JSON_FLAGS if program else ():
        try:
            done = subprocess.run([program, *flags], capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode == 0 and done.stdout.strip()[:1] in ("[", "{"):
            return done.stdout
    return None


def _neuron_ls_devices(*outputs: str | None) -> dict:
    """What ``neuron-ls`` says, from its JSON or text outputs (the first that has a field wins): ``instance_type``,
    ``lnc`` (``logical-neuroncore-config``), ``cores`` (logical NeuronCores per device), ``holders`` (pid, command)."""
    found = {"instance_type": None, "lnc": None, "cores": [], "holders": []}
    for output in outputs:
        for key, value in (_neuron_ls_json_fields(output) or _neuron_ls_text_fields(output or "")).items():
            found[key] = found[key] or value
    return found


def _neuron_ls_json_fields(output: str | None) -> dict | None:
    """:func:`_neuron_ls_devices`' fields from ``neuron-ls -j``'s list of devices (``nc_count``, ``neuron_processes``
    ...); from any other JSON, the records that carry those same fields; ``None`` when ``output`` is not JSON."""
    try:
        data = json.loads(output or "")
    except ValueError:
        return None
    devices = data if isinstance(data, list) else next(
        (v for v in (data.values() if isinstance(data, dict) else ()) if isinstance(v, list)
         and v and all(isinstance(d, dict) and "neuron_device" in d for d in v)), [])
    devices = [d for d in devices if isinstance(d, dict)]
    holders = [(p.get("pid"), p.get("command", "")) for d in devices for p in d.get("neuron_processes") or ()]
    return {"instance_type": None, "lnc": next((d["logical_neuroncore_config"] for d in devices
                                                if "logical_neuroncore_config" in d), None),
            "cores": [int(d["nc_count"]) for d in devices if "nc_count" in d],
            "holders": list(dict.fromkeys((int(pid), command) for pid, command in holders if pid is not None))}


def _neuron_ls_text_fields(text: str) -> dict:
    """:func:`_neuron_ls_devices`' fields from ``neuron-ls``'s table and header lines, whichever columns it has: the
    v2.21 docs' ``NEURON CORES`` (physical) beside ``LOGICAL NC``, later ones ``NEURON CORES`` at the header's LNC."""
    header = dict(re.findall(r"^\s*(instance-type|logical-neuroncore-config):\s*(\S+)", text, flags=re.M))
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.strip().startswith("|")]
    first = next((i for i, row in enumerate(rows) if row[0].isdigit()), len(rows))
    labels = [" ".join(filter(None, parts)) for parts in zip(*rows[:first])]
    data = [row for row in rows[first:] if len(row) == len(labels)]
    column = {name: labels.index(name) for name in ("LOGICAL NC", "NEURON CORES", "PID", "COMMAND") if name in labels}
    cores_at = column.get("LOGICAL NC", column.get("NEURON CORES"))
    pid_at, command_at = column.get("PID"), column.get("COMMAND")
    return {"instance_type": header.get("instance-type"),
            "lnc": int(header["logical-neuroncore-config"]) if header.get("logical-neuroncore-config", "").isdigit()
            else None,
            "cores": [int(row[cores_at]) for row in data if cores_at is not None and row[0].isdigit()
                      and row[cores_at].isdigit()],
            "holders": list(dict.fromkeys((int(row[pid_at]), row[command_at] if command_at is not None else "")
                                          for row in data if pid_at is not None and row[pid_at].isdigit()))}


def _neuron_core_holders(neuron_ls_text: str | None, ignore_pids: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """``(pid, command)`` of each process ``neuron-ls`` (JSON or text) lists as holding a Neuron device, but
    ``ignore_pids``."""
    return [(pid, command) for pid, command in _neuron_ls_devices(neuron_ls_text)["holders"] if pid not in ignore_pids]


def _format_core_holders(holders: list[tuple[int, str]]) -> str:
    """``"PID 4242 (python -m ipykernel_launcher); PID ..."``: :func:`_neuron_core_holders` for a message."""
    return "; ".join(f"PID {pid} ({command or 'unknown command'})" for pid, command in holders)


def pick_device(prefer: str | torch.device | None = None, verbose: bool = True) -> torch.device:
    """Return the device to use, like d2l's ``try_gpu()`` but for neuron > cuda > cpu.
    ``None`` reads ``TRNLAB_DEVICE`` (``"auto"``: the best, saying why); a missing ``"neuron:3"``: NotAvailableError."""
    prefer = str(_read_settings().device if prefer is None else prefer or "auto").strip().lower()
    if prefer == "auto":
        backend = detect_backend()
        if verbose and backend != "neuron":
            reasons = {"neuron": "no neuron device (TorchNeuron is not installed here: it runs on trn2/trn3)",
                       "cuda": "no CUDA GPU"}
            print(f"Using {backend}: " + "; ".join(reasons[b] for b in _BACKENDS[: _BACKENDS.index(backend)]) + ".")
        elif verbose:
            standin = getattr(_neuron_module(), "standin", False)  # trnlab's stand-in says what it is
            print(f"Using neuron: {_device_count('neuron')} NeuronCore(s) visible" +
                  (f" ({_neuron_module().__doc__})." if standin else "."))
        return torch.device(backend, 0) if backend != "cpu" else torch.device("cpu")
    backend, _, index = prefer.partition(":")
    if backend not in _BACKENDS:
        raise ValueError(f"unknown device {prefer!r}: use 'auto' or one of {', '.join(_BACKENDS)}, "
                         "optionally with an index (e.g. 'neuron:3')")
    if not _backend_available(backend):
        raise NotAvailableError(f"{backend} was requested but is not available. {_INSTALL_HINTS[backend]}")
    count = _device_count(backend)
    if index and (not index.isdigit() or int(index) >= count):
        raise NotAvailableError(f"{prefer} was requested but this process sees {count} {backend} device(s): "
                                f"use an index from 0 to {count - 1}.")
    return torch.device(prefer) if backend != "cpu" else torch.device("cpu")


def resolve_dtype(dtype: torch.dtype | str | None = None, device: torch.device | str = "cpu") -> torch.dtype:
    """The dtype to load a model in on ``device``.
    ``None`` reads ``TRNLAB_DTYPE``; ``"auto"``: bfloat16 where computed natively (Trainium), else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = _read_settings().dtype if dtype is None else _check("dtype", dtype)
    if name == "auto":
        return torch.bfloat16 if _bf16_supported(torch.device(device).type) else torch.float32
    return getattr(torch, name)


def resolve_device_map(device_map="auto", backend: str | None = None):
    """Return the ``device_map`` that ``from_pretrained`` should get on this machine.
    On Neuron ``"auto"`` becomes ``"neuron"`` with a warning (Accelerate would load on CPU); others must exist."""
    if device_map is None or isinstance(device_map, dict):
        return device_map
    device_map, backend = str(device_map), backend or detect_backend()
    if device_map == "auto":
        if backend == "neuron":
            warnings.warn("device_map='auto' loads on CPU on Neuron, silently (Accelerate <= 1.15 sizes no neuron "
                          "device; 1.16 asks torch.neuron.mem_get_info, found neither in the Neuron docs nor in a "
                          "TorchNeuron source snapshot, and falls back to CPU). Using device_map='neuron' instead; "
                          "pass device_map='neuron' yourself to silence this warning.", UserWarning, stacklevel=2)
            return "neuron"
        return "auto" if backend == "cuda" else "cpu"
    requested = device_map.split(":")[0]
    if requested in ("neuron", "cuda") and requested != backend and not _backend_available(requested):
        raise NotAvailableError(f"device_map={device_map!r} but {requested} is not available. "
                                f"{_INSTALL_HINTS[requested]}")
    return device_map


def _accelerator_memory(device: torch.device | str) -> dict | None:
    """Bytes held by tensors on ``device`` now and at most so far, from ``torch.accelerator`` (None on CPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "memory_allocated"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.accelerator.memory_allocated: "
                           "upgrade torch to 2.9 or later (the course uses 2.13) to read device memory.")
    if _current_accelerator() != device.type:
        raise ValueError(f"{device} is not this process's accelerator ({_current_accelerator() or 'none'}): "
                         "torch.accelerator counts memory of the current accelerator only.")
    index = device.index if device.index is not None else accelerator.current_device_index()
    accelerator.synchronize(index)  # Neuron's allocator is asynchronous: read after queued work is done
    return {"allocated": int(accelerator.memory_allocated(index)),
            "max_allocated": int(accelerator.max_memory_allocated(index))}


def _human_bytes(n: int) -> str:
    """``n`` bytes for a reader: ``"512 B"``, ``"3.4 MiB"``, ``"1.2 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def format_accelerator_memory(device: torch.device | str) -> str:
    """Device memory held by tensors, as one line for a notebook; on CPU, a sentence saying there is no counter."""
    device = torch.device(device)
    memory = _accelerator_memory(device)
    if memory is None:
        return (f"{device}: the CPU has no such counter (torch.accelerator.memory_allocated counts the memory "
                "of an accelerator, CUDA or Neuron); on CPU, tensors live in this process's ordinary RAM.")
    return (f"{device}: {_human_bytes(memory['allocated'])} allocated by tensors now, "
            f"{_human_bytes(memory['max_allocated'])} at most so far (torch.accelerator.memory_allocated / "
            "max_memory_allocated)")


#: How to release NeuronCores, said wherever a process is found holding them.
_RELEASE_CORES_HINT = (
    "a process, a notebook kernel too, keeps every NeuronCore it sees until it exits, and the next one "
    "then fails with \"Neuron runtime cannot be initialized\". Release them: shut that notebook's kernel "
    "down (Kernel > Shut Down Kernel) or end the process (`kill <PID>`); or run two notebooks at once on "
    "different cores, with NEURON_RT_VISIBLE_CORES set before each kernel starts (e.g. 0-1 and 2-3)")


def core_holders_notice(neuron_ls_text: str | None, backend: str | None = None,
                        own_pid: int | None = None) -> str:
    """What :func:`setup` prints: who holds NeuronCores per ``neuron-ls`` (never ``own_pid``), and how to free them."""
    backend = backend or detect_backend()
    visible = _visible_cores_setting()
    if neuron_ls_text is None:
        if backend != "neuron":
            return ("NeuronCores: none on this machine (no neuron-ls, no neuron device). On a trn2, setup() "
                    "lists here the processes that hold NeuronCores and how to release them.")
        return ("NeuronCores: neuron-ls is not on PATH (it comes with the Neuron tools, aws-neuronx-tools), so "
                "setup() cannot tell which process holds them. A notebook kernel keeps every core it sees "
                "until it shuts down: shut down other notebooks' kernels before this one runs.")
    own = os.getpid() if own_pid is None else own_pid
    holders = _neuron_core_holders(neuron_ls_text, ignore_pids=(own,))
    sees = (f"this kernel (PID {own}) sees NeuronCores {visible} (NEURON_RT_VISIBLE_CORES)" if visible else
            f"this kernel (PID {own}) will claim every NeuronCore at its first neuron operation")
    if not holders:
        return (f"NeuronCores: no other process holds one (neuron-ls); {sees}. Shut this kernel down when "
                "you are done, so that the next notebook can have them.")
    return (f"NeuronCores: held by {_format_core_holders(holders)} (neuron-ls); {sees}. "
            f"{_RELEASE_CORES_HINT[0].upper() + _RELEASE_CORES_HINT[1:]}.")


# What setup() saw when it ran: run_summary() reports the difference.
_run: dict = {}


def _neffs() -> list | None:
    """``torch.neuron.get_dynamo_metrics()`` on Trainium (one entry per NEFF), else ``None``."""
    getter = getattr(getattr(torch, "neuron", None), "get_dynamo_metrics", None)
    return list(getter()) if getter is not None else None


def _neff_kinds(metrics: list) -> str:
    """``"F forward, B backward, I inference"``: the AOTAutograd graph names (``model__0_forward_1``) counted."""
    names = [str(m.get("graph_name", "") if isinstance(m, dict) else getattr(m, "graph_name", "")) for m in metrics]
    kinds = {k: sum(k in n for n in names) for k in ("forward", "backward", "inference")}
    other = len(names) - sum(kinds.values())
    return ", ".join(f"{n} {k}" for k, n in kinds.items()) + (f", {other} unnamed" if other else "")


def setup(device: str | None = None, seed: int = 0, cpu_threads: int | None = None,
          dtype: torch.dtype | str | None = None) -> torch.device:
    """Seed every generator, print versions, who holds NeuronCores and the device, and return that device.
    ``None`` reads ``TRNLAB_DEVICE``, ``TRNLAB_CPU_THREADS`` (0: torch's choice), starts :func:`run_summary`'s clock.
    Records the device and the dtype (``dtype``, else ``TRNLAB_DTYPE`` as :func:`resolve_dtype` resolves it) with the
    outputs (:func:`trnlab.run_record.record_run`), for ``trnlab.pytest_plugin``."""
    current = _read_settings()
    random.seed(seed)
    torch.manual_seed(seed)
    versions = _package_versions()
    print(", ".join(f"{name} {version}" for name, version in versions.items() if version))
    for warning in newer_than_tested(versions):
        print(f"warning: {warning}")
    chosen = pick_device(device if device is not None else current.device)
    threads = current.cpu_threads if cpu_threads is None else cpu_threads
    if chosen.type == "cpu" and threads:
        torch.set_num_threads(threads)
    print(core_holders_notice(_neuron_ls_json() or _neuron_ls_output(), backend=chosen.type))
    print(f"device: {chosen}")
    record_run(chosen, resolve_dtype(dtype, chosen), model=current.model or "bundled")
    _run.update(start=time.perf_counter(), graphs=_compat.dynamo_unique_graphs(), neffs=len(_neffs() or []),
                device=str(chosen))
    return chosen


def run_summary() -> str:
    """How many graphs this notebook compiled since :func:`setup`, in how long, and what that costs on a trn2.
    The trn2 cost is marked as an estimate with its source; on Neuron the NEFF count follows."""
    if not _run:
        raise RuntimeError("trnlab.run_summary() reports what ran since trnlab.setup(): call "
                           "trnlab.setup() at the top of the notebook first.")
    graphs = _compat.dynamo_unique_graphs() - _run["graphs"]
    seconds = time.perf_counter() - _run["start"]
    lines = [f"this notebook compiled {graphs} graph(s) in {seconds:.0f} s on {_run['device']}",
             "on a trn2: each graph is a neuronx-cc compilation to a NEFF (a training graph two: TorchNeuron's AOT "
             'Autograd stage compiles its forward and backward apart, Neuron docs, "How torch.compile works on '
             'Neuron"), which can take minutes for a large '
             'model (an estimate, from the Neuron docs, "How to optimize a model with torch.compile": the first call '
             'with a new input signature "can take several minutes for large models"; no figure is published for a '
             "model as small as the course's); a warm NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR) lets a re-run skip "
             "them"]
    metrics = _neffs()
    if metrics is not None:
        if len(metrics) >= _run["neffs"]:
            since, metrics = "since setup()", metrics[_run["neffs"]:]
        else:   # reset since setup(): count what is there
            since = "since torch.neuron.reset_dynamo_metrics() was last called"
        what = ("graph(s) the STAND-IN backend received, no NEFF" if getattr(torch.neuron, "standin", False)
                else "NEFF(s) compiled")
        lines.append(f"torch.neuron.get_dynamo_metrics(): {len(metrics)} {what} ({_neff_kinds(metrics)}) {since}")
    return "\n".join(lines)
