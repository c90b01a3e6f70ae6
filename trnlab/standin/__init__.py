"""A STAND-IN ``neuron`` device (PrivateUse1, as PyTorch's "openreg"): host memory, CPU kernels, TorchNeuron's API.
``TRNLAB_NEURON_STANDIN=1`` starts it at ``import torch``, :func:`enable` in a running process; its backend ``"neuron"``
counts graphs as TorchNeuron's AOTAutograd does. Not Trainium's speed, numerics or NEFFs: :data:`STANDIN_NOTICE`."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys
import types
import warnings
from pathlib import Path

import torch

from trnlab import _compat
from trnlab.rank_cores import _VISIBLE_CORES_VAR, _parse_core_list
from trnlab.run_record import _installed
from trnlab.settings import _NEURON_STANDIN_ENV_VAR, NotAvailableError
from trnlab._standin_entry import autoload, _pending

__all__ = ["STANDIN_NOTICE", "STANDIN_VERSION", "CompiledGraph", "StandInNeuronModule", "autoload",
           "cache_dir", "enable", "neuron_backend", "start"]

#: What the stand-in is: printed once when it starts, carried by ``torch.neuron`` and each compiled graph's record.
STANDIN_NOTICE = ("STAND-IN neuron device: host memory and CPU kernels, not Trainium; "
                  "nothing measured here is Trainium's")
#: ``torch_neuronx.__version__`` on the stand-in.
STANDIN_VERSION = "0.0.0+trnlab.standin"
_SOURCES = [Path(__file__).with_name(name) for name in ("standin.cpp", "c10d.h")]  # standin.cpp includes c10d.h
_NAME = "trnlab_neuron_standin"
_CFLAGS = ["-O1"]  # at -O0 the fallback costs more than a small op's CPU kernel; -O2 builds 40% longer, no faster
_loaded = []  # the extension, once loaded: its kernels register once per process
_METRICS: list[CompiledGraph] = []


def cache_dir() -> Path:
    """Where the extension is built: ``$XDG_CACHE_HOME/trnlab/standin/<torch>-<python>-<source and flags hash>``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES) + str(_CFLAGS).encode()).hexdigest()[:12]
    return base / "trnlab" / "standin" / (key + digest)


def _check_toolchain() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise NotAvailableError(f"it is built from C++ on first use, and there is no C++ compiler ({compiler!r} is "
                                "not on PATH): install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select "
                                "--install)")
    venv_bin = str(Path(sys.executable).parent)  # pip's ninja, in an environment that is not activated
    if shutil.which("ninja") is None and shutil.which("ninja", path=venv_bin):
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")
    if shutil.which("ninja") is None:
        raise NotAvailableError("it is built on first use with ninja, which is not on PATH: pip install ninja")


def _extension():
    if _loaded:
        return _loaded[0]
    folder = cache_dir()
    if (folder / "ready").exists():
        spec = importlib.util.spec_from_file_location(_NAME, folder / f"{_NAME}.so")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        _check_toolchain()
        from torch.utils import cpp_extension

        folder.mkdir(parents=True, exist_ok=True)
        try:  # load() locks the folder: processes starting together build once
            module = cpp_extension.load(_NAME, [str(_SOURCES[0])], extra_cflags=_CFLAGS,
                                        build_directory=str(folder))
        except Exception as error:
            raise NotAvailableError(f"building {_SOURCES[0].parent} in {folder} failed: {error}; it needs a C++20 compiler "
                               "(apt-get install g++) and ninja (pip install ninja)") from error
        (folder / "ready").write_text(f"torch {torch.__version__}\n")
    _loaded.append(module)
    return module


def _index(device) -> int:
    index = device if device is None or isinstance(device, int) else torch.device(device).index
    return torch.accelerator.current_device_index() if index is None else index


class StandInNeuronModule(types.ModuleType):
    """``torch.neuron`` on the STAND-IN device: TorchNeuron's functions, answered by host memory and CPU kernels."""

    standin = True

    def __init__(self, extension, cores: int, rank_device: int | None = None):
        super().__init__("torch.neuron", STANDIN_NOTICE)
        self._extension, self.cores = extension, cores
        self._indices = range(cores) if rank_device is None else [rank_device]  # a torchrun rank has its one core

    def __repr__(self) -> str:
        return f"<module 'torch.neuron' ({STANDIN_NOTICE}; {self.device_count()} device(s))>"

    class device:  # noqa: N801 (torch.cuda.device's name; torch.utils.checkpoint enters it)
        """Inside the block, ``device`` is the current stand-in device."""

        def __init__(self, device):
            self.index, self.previous = _index(device), None

        def __enter__(self):
            self.previous = torch.accelerator.current_device_index()
            torch.accelerator.set_device_index(self.index)

        def __exit__(self, *exc):
            torch.accelerator.set_device_index(self.previous)

    def is_available(self) -> bool:
        return self.device_count() > 0

    def device_count(self) -> int:
        return self._extension.device_count()

    def current_device(self) -> int:
        return torch.accelerator.current_device_index()

    def set_device(self, device) -> None:
        torch.accelerator.set_device_index(_index(device))

    def get_device_name(self, device=None) -> str:
        return f"neuron:{_index(device)} (STAND-IN: host memory and CPU kernels, not Trainium)"

    def synchronize(self, device=None) -> None:
        """Returns at once: the host has run each op before its call returned."""

    def empty_cache(self) -> None:
        """Frees nothing: the stand-in's allocator caches no memory."""

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:  # _compat.DEVICE_MODULE_BAD_FORK_HOOK: torch.manual_seed seeds us through it
        return False

    def _generator(self, device=None):
        return self._extension.default_generator(_index(device))

    def manual_seed(self, seed: int) -> None:
        self._generator().manual_seed(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        for index in self._indices:
            self._generator(index).manual_seed(int(seed))

    def get_rng_state(self, device=None) -> torch.Tensor:
        return self._generator(device).get_state()

    def set_rng_state(self, state: torch.Tensor, device=None) -> None:
        self._generator(device).set_state(state)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(index) for index in self._indices]

    def set_rng_state_all(self, states) -> None:
        for index, state in zip(self._indices, states):
            self.set_rng_state(state, index)

    class Stream(torch.Stream):
        """A stream on a STAND-IN device: one synchronous stream, so waits and records return at once."""

        def __new__(cls, device=None, priority: int = 0):
            return super().__new__(cls, device=torch.device("neuron", _index(device)), priority=priority)

    class Event(torch.Event):
        """An event on a STAND-IN device: complete as soon as it is recorded."""

        def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
            return super().__new__(cls, device=torch.device("neuron", _index(None)), enable_timing=enable_timing,
                                   blocking=blocking, interprocess=interprocess)

    def current_stream(self, device=None) -> torch.Stream:
        return torch.accelerator.current_stream(_index(device))

    def default_stream(self, device=None) -> torch.Stream:
        return torch.accelerator.current_stream(_index(device))

    def stream(self, stream):
        """``with torch.neuron.stream(s):`` (every stand-in stream is the device's one synchronous stream)."""
        return contextlib.nullcontext(stream)

    def is_bf16_supported(self) -> bool:
        return True

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    def memory_allocated(self, device=None) -> int:
        """Bytes the stand-in's allocator holds for tensors on ``device`` (host memory, not HBM)."""
        return torch.accelerator.memory_allocated(_index(device))

    def max_memory_allocated(self, device=None) -> int:
        return torch.accelerator.max_memory_allocated(_index(device))

    def memory_reserved(self, device=None) -> int:
        return torch.accelerator.memory_reserved(_index(device))

    def memory_stats(self, device=None) -> dict:
        return dict(torch.accelerator.memory_stats(_index(device)))

    def reset_peak_memory_stats(self, device=None) -> None:
        torch.accelerator.reset_peak_memory_stats(_index(device))

    def get_dynamo_metrics(self) -> list[CompiledGraph]:
        """One :class:`CompiledGraph` per graph the ``"neuron"`` backend compiled (TorchNeuron: one per NEFF)."""
        return list(_METRICS)

    def reset_dynamo_metrics(self) -> None:
        _METRICS.clear()
        _compat.dynamo_counters()["neuron"].clear()


@dataclasses.dataclass(frozen=True)
class CompiledGraph:
    """A graph the STAND-IN ``"neuron"`` backend compiled, as TorchNeuron records one; no NEFF is made."""

    graph_name: str  # AOTAutograd's: model__0_forward_1, model__0_backward_1, model__1_inference_0
    graph_node_count: int
    has_collectives: bool
    note: str = STANDIN_NOTICE


_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")  # TorchNeuron's _has_collectives_in_graph
_DYNAMIC = ("\n\nDynamic shapes detected in the model, but torch-neuronx requires static shapes. Found {count} "
            "dynamic dimension(s): {names}\nTo fix this issue:\n1. Ensure all input tensors have fixed, known shapes\n"
            "2. Avoid operations that create dynamic shapes (e.g., dynamic slicing, variable-length sequences)\n"
            "(STAND-IN neuron backend, in TorchNeuron's words: compile with dynamic=False)")


def _record(gm) -> None:
    targets = [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"]
    collectives = any(c in target for target in targets for c in _COLLECTIVES)
    _METRICS.append(CompiledGraph(_compat.aot_graph_name(), len(gm.graph.nodes), collectives))
    counters = _compat.dynamo_counters()["neuron"]
    counters["compiled_graphs"] += 1
    if collectives:
        counters["graphs_with_collectives"] += 1


def neuron_backend(gm, example_inputs, *, options=None, mode="default"):
    """The STAND-IN ``torch.compile(backend="neuron")``: TorchNeuron's checks and AOTAutograd, then CPU kernels.
    As TorchNeuron's: another mode warns and runs as ``"default"``, symbolic sizes (``dynamic=True``) raise, and
    every graph AOTAutograd hands over (forward, backward, inference) is counted."""
    from functorch.compile import make_boxed_func

    if mode != "default":
        logging.warning(f"Neuron backend does not support mode='{mode}', falling back to default mode. "
                        "(STAND-IN neuron backend)")
    if sizes := _compat.graph_symbolic_sizes(gm):
        raise RuntimeError(_DYNAMIC.format(count=len(sizes), names=f"{sizes[:3]}{'...' if len(sizes) > 3 else ''}"))

    def compile_graph(graph, inputs):
        _record(graph)
        return make_boxed_func(graph.forward)

    return _compat.aot_autograd(fw_compiler=compile_graph, keep_inference_input_mutations=True)(gm, example_inputs)


_CLAIMED: list[int] = []  # the NeuronCore this rank claimed with its first `neuron` process group
_EARLY = ("a tensor was put on neuron before init_process_group, which starts the Neuron runtime too early: create "
          "the process group first, then move tensors and models to the device (STAND-IN, as TorchNeuron asserts)")


def _claim_core(store, rank: int) -> None:
    """What TorchNeuron's process group does first in a rank: one visible NeuronCore, ``LOCAL_RANK``'s when unset,
    claimed before the runtime starts. Two ranks of a node on one core raise here, as the real runtime refuses them.
    A rank that set ``LOCAL_RANK`` itself after importing torch (one spawned by ``torch.multiprocessing``, as
    Transformers' distributed test mixins do) gets ``neuron:<LOCAL_RANK>`` as its one device here, as TorchNeuron's
    process group sets its device start index then."""
    module, local = torch.neuron, os.environ.get("LOCAL_RANK", "").strip()
    if local and len(module._indices) > 1:  # not yet a rank's one device: enable() ran before LOCAL_RANK was set
        if not local.isdigit() or int(local) >= module.cores:
            raise RuntimeError(f"LOCAL_RANK={local!r}: give this rank's index on its node, 0 to {module.cores - 1} "
                               f"(the STAND-IN has {module.cores} NeuronCores)")
        if any(torch.accelerator.max_memory_allocated(index) for index in module._indices):
            raise RuntimeError(_EARLY)
        module._extension.set_rank_device(int(local), int(os.environ.get("LOCAL_WORLD_SIZE", module.cores)))
        module._indices = [int(local)]
    local_rank = module.current_device()
    visible = os.environ.get(_VISIBLE_CORES_VAR, "").strip() or os.environ.setdefault(_VISIBLE_CORES_VAR,
                                                                                     str(local_rank))
    cores = _parse_core_list(visible)
    if len(cores) != 1:
        raise RuntimeError(f"{_VISIBLE_CORES_VAR}={visible} gives rank {rank} {len(cores)} NeuronCores, and the "
                           "neuron process group takes one per process: unset it (rank i then takes core i), or "
                           f"give each rank its own: python -m trnlab launch --neuron-cores {visible} ... "
                           "(STAND-IN, as TorchNeuron asserts)")
    if torch.accelerator.max_memory_allocated(local_rank):
        raise RuntimeError(_EARLY)
    node = os.environ.get("GROUP_RANK", "0")
    if (holders := store.add(f"trnlab-standin/node{node}/core{cores[0]}", 1)) > 1:
        raise RuntimeError(f"NeuronCore {cores[0]} of node {node} is claimed by {holders} ranks (rank {rank} is the "
                           f"last; {_VISIBLE_CORES_VAR}={visible}): give each rank its own core, e.g. python -m "
                           "trnlab launch --neuron-cores ... (STAND-IN; the Neuron runtime refuses a held core)")
    _CLAIMED.append(cores[0])


def _create_process_group(options, backend_options=None):
    """The STAND-IN ``neuron`` c10d backend (``init_process_group("neuron")``, ``init_device_mesh("neuron", ...)``):
    gloo's collectives on the host memory of this rank's one device. Not NeuronLink, EFA or Trainium's numerics."""
    import torch.distributed as dist

    if not _CLAIMED:
        _claim_core(options.store, options.group_rank)
    gloo = dist.ProcessGroupGloo(options.store, options.group_rank, options.group_size, options.timeout)
    return _extension().NeuronBackend(gloo, torch.neuron.current_device())


class _OnDynamoImport(importlib.abc.MetaPathFinder):
    """Registers :func:`neuron_backend` right after ``torch._dynamo`` is imported: starting imports no dynamo."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _compat.register_dynamo_backend("neuron", neuron_backend)

        spec.loader.exec_module = exec_module
        return spec


def _real_torchneuron() -> str | None:
    if version := _installed("torch-neuronx"):
        return f"torch-neuronx {version} is installed"
    existing = torch.__dict__.get("neuron")
    if existing is not None and not getattr(existing, "standin", False):
        return f"torch.neuron is already registered ({existing!r})"
    if (name := _compat.privateuse1_backend_name()) not in ("privateuseone", "neuron"):
        return f"PyTorch's private backend is already named {name!r} in this process"
    return None


def enable(cores: int = 4) -> StandInNeuronModule:
    """Start the STAND-IN neuron device with ``cores`` devices (4: a trn2.3xlarge) and its ``neuron`` process group;
    returns ``torch.neuron``. In a torchrun rank its one device is ``neuron:<LOCAL_RANK>``, as TorchNeuron's. Beside a
    real TorchNeuron or without a compiler it raises :class:`NotAvailableError` and changes nothing."""
    local_rank = os.environ.get("LOCAL_RANK", "").strip()  # torchrun's: the rank sees one core, neuron:<LOCAL_RANK>
    current = torch.__dict__.get("neuron")
    if isinstance(current, StandInNeuronModule):
        if current.cores != cores:
            raise NotAvailableError(f"the STAND-IN neuron device runs with cores={current.cores} in this process; "
                               "start a new process for another count")
        return current
    if reason := _real_torchneuron():
        raise NotAvailableError(f"the STAND-IN neuron device does not start beside a real TorchNeuron: {reason}. "
                                f"Use the real neuron device and unset {_NEURON_STANDIN_ENV_VAR} (torch-neuronx 1.0 "
                                "from PyPI is a 2022 placeholder: pip uninstall torch-neuronx)")
    if not 1 <= cores <= 64:
        raise NotAvailableError(f"cores={cores}: give 1 to 64 (4: a trn2.3xlarge; 1: what each torchrun rank sees)")
    try:
        extension = _extension()
    except NotAvailableError as error:
        raise NotAvailableError(f"the STAND-IN neuron device cannot start: {error}") from error
    extension.set_device_count(cores)
    if local_rank:
        extension.set_rank_device(int(local_rank), int(os.environ.get("LOCAL_WORLD_SIZE", int(local_rank) + 1)))
    if _compat.privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    module = StandInNeuronModule(extension, cores, int(local_rank) if local_rank else None)
    if current is None:
        _compat.register_device_module("neuron", module)
    else:  # a torch.neuron left by an earlier enable(): replace it
        torch.neuron = sys.modules["torch.neuron"] = module
    if not hasattr(torch.Tensor, "neuron"):
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    torch_neuronx = types.ModuleType("torch_neuronx", f"{STANDIN_NOTICE} (trnlab.standin, not torch-neuronx)")
    torch_neuronx.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)  # what find_spec() finds
    torch_neuronx.__version__, torch_neuronx.standin = STANDIN_VERSION, True
    sys.modules["torch_neuronx"] = torch_neuronx
    if "torch._dynamo" in sys.modules:
        _compat.register_dynamo_backend("neuron", neuron_backend)
    elif not any(isinstance(finder, _OnDynamoImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OnDynamoImport())
    import torch.distributed as dist

    if dist.is_available() and not hasattr(dist.Backend, "NEURON"):
        dist.Backend.register_backend("neuron", _create_process_group, extended_api=True, devices=["neuron"])
    _compat.clear_detection_caches()
    print(STANDIN_NOTICE, file=sys.stderr)
    return module


def start(value: str = "1") -> None:
    """What ``TRNLAB_NEURON_STANDIN=<value>`` asks at ``import torch``: :func:`enable` for ``1``.
    It never raises (``import torch`` must go on): a stand-in that cannot start warns, and nothing changes."""
    try:
        if value != "1":
            raise NotAvailableError(f"{_NEURON_STANDIN_ENV_VAR}={value!r}: set it to 1 to start the stand-in, or 0")
        if not hasattr(_compat, "register_dynamo_backend"):
            raise NotAvailableError("trnlab was imported before torch: import torch first")
        enable()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"{_NEURON_STANDIN_ENV_VAR}: {error}. Continuing without it (no neuron device).",
                      RuntimeWarning, stacklevel=2)


if _pending:  # import torch ran while this module was being imported (it imports torch first)
    start(_pending.pop())
