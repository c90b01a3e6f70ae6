"""Launch a training script with ``torchrun`` on this machine (claim 10): the Trainium instances, the mesh check, the
command, and the supervision that streams every rank's lines and leaves no process behind.
Only a run on a subset of NeuronCores starts each rank through :mod:`trnlab.rank_cores` (see :func:`launch`)."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from trnlab.device import (_backend_available, core_holders_notice, detect_backend, _device_count, _neuron_core_holders,
                           _neuron_ls_json, _neuron_ls_output, _neuron_module)
from trnlab.models import load_config
from trnlab.rank_cores import (_VISIBLE_CORES_VAR, _format_core_list, _listed_cores, _parse_core_list,
                               _visible_cores_setting, rank_neuron_cores)
from trnlab.settings import _NEURON_STANDIN_ENV_VAR, LaunchError, PlanError, SettingError, whole_number

__all__ = ["GiB", "INSTANCES", "Instance", "get_instance", "validate_parallel_sizes", "check_mesh", "plan_processes",
           "torchrun_command", "launch", "launch_loopback_nodes", "LaunchResult", "ProcessPlan", "RESTART_ENV"]

# Instances: the Trainium machines the planner and the launcher know, from the Neuron docs
#: Bytes in one gibibyte (2**30): every GiB figure of the instance table and the planner.
GiB = 1024 ** 3
_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/"
_TRN2_ARCH_URL = _DOCS + "general/arch/neuron-hardware/trn2-arch.html"
_TRN3_ARCH_URL = _DOCS + "about-neuron/arch/neuron-hardware/trn3-arch.html"
_TORCHNEURON_QUICKSTART_URL = _DOCS + "torch/get-started/quickstart-torch-neuron.html"
_TRN1 = ("trn1 (Trainium, 2 NeuronCore-v2 and 32 GiB per chip) has no native `neuron` device: TorchNeuron supports "
         "trn2 and trn3 only, and trn1 keeps the older XLA-based torch-neuronx (torch-xla, neuron_parallel_compile). "
         "This course and planner target trn2/trn3: use e.g. trn2.48xlarge.")


@dataclass(frozen=True)
class Instance:
    """One Trainium machine (or UltraServer) as the planner sees it; ``hosts`` is its number of torchrun nodes.
    ``logical_cores`` = chips x physical NeuronCores per chip / LNC, one rank each; ``hbm_per_core`` is the chip's HBM
    split between them, before runtime overhead (docs: "approximately 24 GiB of HBM per rank" on trn2)."""

    name: str
    family: str                    # "trn2" or "trn3"
    chips: int
    hbm_per_chip_gib: int
    physical_cores_per_chip: int = 8
    lnc: int = 2                   # NEURON_LOGICAL_NC_CONFIG default on Trn2 and later
    hosts: int = 1
    source: str = ""

    @property
    def cores_per_chip(self) -> int:
        return self.physical_cores_per_chip // self.lnc

    @property
    def logical_cores(self) -> int:
        return self.chips * self.cores_per_chip

    @property
    def cores_per_host(self) -> int:
        return self.logical_cores // self.hosts

    @property
    def hbm_per_core(self) -> int:  # bytes
        return self.hbm_per_chip_gib * GiB // self.cores_per_chip

    @property
    def hbm_total(self) -> int:
        return self.hbm_per_chip_gib * GiB * self.chips

    def to_dict(self) -> dict:
        return {**asdict(self), "logical_cores": self.logical_cores, "cores_per_host": self.cores_per_host,
                "hbm_per_core_bytes": self.hbm_per_core, "hbm_total_bytes": self.hbm_total}


#: Instances the native ``neuron`` device supports; each row's ``source`` is its Neuron docs page. Per chip: Trainium2
#: 8 NeuronCore-v3, 96 GiB; Trainium3 8 NeuronCore-v4, 144 GiB; LNC=2 (logical NeuronCore config) gives 4 logical cores.
INSTANCES: dict[str, Instance] = {inst.name: inst for inst in (
    Instance("trn2.3xlarge", "trn2", chips=1, hbm_per_chip_gib=96, source=_TORCHNEURON_QUICKSTART_URL),
    Instance("trn2.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=_TRN2_ARCH_URL),
    Instance("trn2u.48xlarge", "trn2", chips=16, hbm_per_chip_gib=96, source=_TRN2_ARCH_URL),
    Instance("trn2-ultraserver", "trn2", chips=64, hbm_per_chip_gib=96, hosts=4, source=_TRN2_ARCH_URL),
    Instance("trn3-gen1-ultraserver", "trn3", chips=64, hbm_per_chip_gib=144, hosts=4, source=_TRN3_ARCH_URL),
    Instance("trn3-gen2-ultraserver", "trn3", chips=144, hbm_per_chip_gib=144, hosts=36, source=_TRN3_ARCH_URL),
)}


def get_instance(name: str | Instance) -> Instance:
    """The :class:`Instance` called ``name`` (e.g. ``"trn2.48xlarge"``), from :data:`INSTANCES`.
    Raises :class:`PlanError` for trn1, saying why, and for unknown names, listing the rest."""
    if isinstance(name, Instance):
        return name
    key = str(name).strip().lower()
    if key in INSTANCES:
        return INSTANCES[key]
    if key.startswith(("trn1.", "trn1n.")):
        raise PlanError(f"{name}: {_TRN1}")
    raise PlanError(f"unknown instance {name!r}: use one of {', '.join(INSTANCES)} "
                    f"(figures from the Neuron docs; trn1 is not supported by the native neuron device).")


# The mesh: does a DistributedConfig layout fit the processes and the model
_TP_DIMENSIONS = (("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads"),
                  ("intermediate_size", "MLP width (intermediate_size)"))  # what TP splits, as a message names it


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_dimensions(config) -> dict[str, int]:
    """The widths of ``config`` that tensor parallelism splits: ``{"num_attention_heads": 32, ...}``."""
    text = config.get_text_config()  # a multimodal config nests it
    return {attr: getattr(text, attr) for attr, _ in _TP_DIMENSIONS if isinstance(getattr(text, attr, None), int)}


def _tp_misfits(dims: dict[str, int], tp_size: int) -> list[tuple[str, str, int]]:
    """``(attribute, label, value)`` of each width in ``dims`` that ``tp_size`` does not divide."""
    return [(attr, label, dims[attr]) for attr, label in _TP_DIMENSIONS if attr in dims and dims[attr] % tp_size]


def _tp_sizes_that_fit(dims: dict[str, int], world_size: int) -> list[int]:
    """The divisors of ``world_size`` that divide every width in ``dims``: the tp sizes that work."""
    return [t for t in _divisors(world_size) if all(v % t == 0 for v in dims.values())]


def _tp_problem(config, tp_size: int, world_size: int | None = None, then: str | None = None) -> str | None:
    """Why ``config`` cannot take tensor-parallel size ``tp_size`` (``None``: it can); the sizes it suggests divide
    ``world_size``, and ``then`` replaces the launcher's advice after them."""
    dims = _tp_dimensions(config)
    if not (bad := _tp_misfits(dims, tp_size)):
        return None
    what = ", ".join(f"{label} = {value}" for _, label, value in bad)
    if then is None:
        then = f" (and fsdp_size = {world_size} // tp_size), or a model whose heads divide by {tp_size}"
    fit = _tp_sizes_that_fit(dims, world_size or dims["num_key_value_heads"])
    return (f"tp_size={tp_size} does not divide the model's {what}: each tensor-parallel rank must get whole heads and "
            f"an equal slice. Use tp_size in {fit}{then}.")


def _mesh_sizes(tp_size, fsdp_size) -> tuple[int, int] | None:
    """``(tp_size, fsdp_size)``, 1 for one not given, ``None`` for neither; 0 or less is refused, never read as 1."""
    if tp_size is None and fsdp_size is None:
        return None
    return (1 if tp_size is None else whole_number("tp_size", tp_size),
            1 if fsdp_size is None else whole_number("fsdp_size", fsdp_size))


def validate_parallel_sizes(world_size: int, tp_size: int = 1, fsdp_size: int = 1, *, dp_replicate_size: int = 1,
                            pp_size: int = 1, model_config=None, check_model: bool = True) -> dict:
    """Check a ``DistributedConfig`` layout against the launch and ``model_config`` (what ``load_config`` takes).
    The sizes' product must equal ``world_size``; heads, KV heads and ``intermediate_size`` divide by ``tp_size``,
    layers by ``pp_size``, a tied vocabulary by ``tp_size * fsdp_size``. Returns the sizes, else :class:`PlanError`."""
    sizes = {name: whole_number(name, value) for name, value in (
        ("pp_size", pp_size), ("dp_replicate_size", dp_replicate_size), ("fsdp_size", fsdp_size), ("tp_size", tp_size))}
    if (product := math.prod(sizes.values())) != world_size:  # say which sizes would do
        pp_size, dp_replicate_size = sizes["pp_size"], sizes["dp_replicate_size"]
        used = " * ".join(f"{k}={sizes[k]}" for k in ("tp_size", "fsdp_size", "dp_replicate_size", "pp_size")
                          if sizes[k] != 1 or k in ("tp_size", "fsdp_size"))
        pairs = [f"tp_size={t}, fsdp_size={world_size // t}" for t in _divisors(world_size)
                 if world_size % (t * pp_size * dp_replicate_size) == 0][:4]
        raise PlanError(f"{used} = {product}, but the launch has {world_size} process(es): the mesh needs exactly one "
                        f"process per position. Either launch {product} processes (nproc_per_node * nnodes = "
                        f"{product}), or change the sizes so their product is {world_size}"
                        + (f" (e.g. {'; '.join(pairs)})." if pairs and pp_size == dp_replicate_size == 1 else "."))
    if not check_model:
        return sizes
    try:
        config = load_config(model_config)  # a name, else a Transformers config (it passes through)
    except (PlanError, OSError) as exc:  # OSError: a model that is not here (NotAvailableError)
        raise PlanError(f"cannot check the mesh against model {model_config!r}: {exc}") from None
    if problem := _tp_problem(config, tp_size, world_size):
        raise PlanError(problem)
    text = config.get_text_config()  # a multimodal config nests it
    vocab, shards = getattr(text, "vocab_size", None), tp_size * fsdp_size
    tied = getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
    if tied and fsdp_size * dp_replicate_size > 1 and isinstance(vocab, int) and vocab % shards:
        raise PlanError(f"vocab_size={vocab} does not divide by tp_size * fsdp_size = {shards}: the tied embedding's "
                        f"rows would be split unevenly, and with tied embeddings under FSDP2 (Transformers 5.24) the "
                        f"padded ranks train lm_head from a stale copy, so the loss silently drifts from a one-process "
                        f"run. Pad the vocabulary first: trnlab.distributed.pad_vocabulary(model, folder, multiple=64) "
                        f"(any multiple of {shards}), or use fsdp_size=1.")
    layers = getattr(text, "num_hidden_layers", None)
    if isinstance(layers, int) and layers % pp_size:
        raise PlanError(f"pp_size={pp_size} does not divide num_hidden_layers={layers}: use pp_size in "
                        f"{_divisors(layers)}.")
    return sizes


def check_mesh(model, tp_size: int, fsdp_size: int | None = None, batch_size: int = 8,
               check_model: bool = True) -> dict:
    """A rank script's check before loading: the mesh against WORLD_SIZE and ``model``, and each FSDP rank's rows of
    the global ``batch_size`` (``fsdp_size=None``: the other ranks). The sizes, else an error that names the fix."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun sets it in every rank
    tp_size = whole_number("--tp-size", tp_size)
    fsdp_size = max(1, world_size // tp_size) if fsdp_size is None else fsdp_size
    validate_parallel_sizes(world_size, tp_size, fsdp_size, model_config=model, check_model=check_model)
    if whole_number("--batch-size", batch_size) % fsdp_size:
        raise SettingError(f"--batch-size {batch_size} does not split over fsdp_size={fsdp_size} ranks: give a "
                           f"multiple of {fsdp_size} (each FSDP rank takes batch-size / fsdp-size rows a step)")
    return {"tp_size": tp_size, "fsdp_size": fsdp_size, "rank_batch_size": batch_size // fsdp_size}


# How many processes, which backend
_DIST_BACKENDS = {"neuron": "neuron", "cuda": "nccl", "cpu": "gloo"}  # Transformers' DISTRIBUTED_BACKEND_MAP agrees
_CPU_DEFAULT_PROCESSES = 2  # when nothing asks for more: enough to show a mesh, few enough for a laptop


@dataclass
class ProcessPlan:
    """What :func:`plan_processes` chose: device type, torch.distributed backend, process count."""

    device: str            # "neuron", "cuda" or "cpu"
    dist_backend: str      # "neuron", "nccl" or "gloo"
    nproc_per_node: int
    devices_visible: int   # NeuronCores / GPUs this node offers (CPU: cores)
    reason: str
    env: dict[str, str] = field(default_factory=dict)  # set for every worker

    def __str__(self) -> str:
        return f"{self.nproc_per_node} process(es) on {self.device}, backend {self.dist_backend}: {self.reason}"


def _cpu_plan(nproc: int | None, note: str = "") -> ProcessPlan:
    """gloo CPU processes sharing this machine's cores; accelerators here are hidden from the ranks."""
    cpus = os.cpu_count() or 1
    chosen = nproc or _CPU_DEFAULT_PROCESSES
    threads = max(1, cpus // chosen)
    hidden = {}
    if _backend_available("cuda"):
        hidden["CUDA_VISIBLE_DEVICES"] = ""  # Transformers would otherwise bind each rank to a GPU
    if _backend_available("neuron"):
        hidden["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch would otherwise autoload TorchNeuron in each rank
    reason = (f"{note or 'no accelerator, so '}{chosen} CPU processes talk over gloo with OMP_NUM_THREADS={threads} "
              f"each ({cpus} core(s) here)")
    if hidden:
        shown = " and ".join(f"{name}={value or repr(value)}" for name, value in hidden.items())
        reason += f"; the ranks get {shown}, so they stay on the CPU"
    if chosen > cpus:
        reason += "; more processes than cores, fine for a tiny model, slow for a real one"
    return ProcessPlan("cpu", "gloo", chosen, cpus, reason, {"OMP_NUM_THREADS": str(threads), **hidden})


def plan_processes(nproc: int | None = None, device=None) -> ProcessPlan:
    """Choose the process count and torch.distributed backend for this machine, as a :class:`ProcessPlan`.
    One per visible NeuronCore (``neuron``) or GPU (``nccl``), else 2 CPU processes on ``gloo``; ``nproc`` asks for a
    number, ``device`` for a kind. More ranks than visible NeuronCores raises :class:`PlanError`."""
    # "cuda" from torch.device("cuda:0"), "cuda:1" or "cuda"; None and "auto" mean what this machine has.
    device = (getattr(device, "type", None) or str(device or "")).split(":")[0].strip().lower()
    device = detect_backend() if device in ("", "auto") else device
    if device not in _DIST_BACKENDS:
        raise SettingError(f"unknown device {device!r}: use one of {', '.join(_DIST_BACKENDS)}")
    nproc = None if nproc is None else whole_number("nproc", nproc)
    if device == "cpu":
        return _cpu_plan(nproc, "" if detect_backend() == "cpu" else "device cpu was asked for, so ")
    if not _backend_available(device):
        raise SettingError(f"device={device!r} was requested but this machine has none: leave device=None to use what "
                           "is here")
    if device == "neuron":
        from_env = _visible_cores_setting()
        visible = len(_parse_core_list(from_env)) if from_env else _device_count("neuron")
        source = f"{_VISIBLE_CORES_VAR}={from_env}" if from_env else "torch.neuron.device_count()"
        what = "NeuronCore"
    else:
        from_env, visible, source, what = None, _device_count("cuda"), "torch.cuda.device_count()", "GPU"
    chosen = nproc or visible
    if chosen > visible and device == "cuda":
        return _cpu_plan(chosen, f"fell back to CPU: {chosen} ranks need {chosen} GPUs, one each, but {source} "
                                 f"gives {visible}, so ")
    if chosen > visible:
        hint = "widen NEURON_RT_VISIBLE_CORES, " if from_env else ""
        raise PlanError(f"{chosen} processes need {chosen} {what}s but {source} gives {visible}: {hint}lower "
                        f"tp_size * fsdp_size to at most {visible}, add nodes (nnodes), or pass device='cpu' for "
                        f"gloo CPU processes.")
    reason = f"one process per {what}, {visible} visible ({source})"
    if chosen < visible:
        reason += f"; {visible - chosen} left idle because the mesh needs {chosen}"
    env = {}
    if device == "neuron" and getattr(_neuron_module(), "standin", False):  # the ranks start it too, sharing the CPUs
        threads = max(1, (os.cpu_count() or 1) // chosen)
        env = {_NEURON_STANDIN_ENV_VAR: "1", "OMP_NUM_THREADS": str(threads)}
        reason += (f"; STAND-IN: each rank's core is host memory, its collectives gloo's, OMP_NUM_THREADS={threads}")
    elif device == "neuron":
        reason += "; each rank starts the Neuron runtime (users report about 6.7 s a process, aws-neuron-sdk#1361)"
    return ProcessPlan(device, _DIST_BACKENDS[device], chosen, visible, reason, env)


# Commands
#: What torchrun needs to restart a group (``--max-restarts``): restarted ranks that share its rendezvous store
#: read the dead ones' addresses from it, and a gloo or STAND-IN group hangs in init_process_group (pytorch#135712).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def torchrun_command(script, script_args=(), *, nproc_per_node: int | None = None, python: str | None = None,
                     tee: bool = True, neuron_cores=None, max_restarts: int = 0) -> list[str]:
    """The ``torchrun`` argument list that runs ``script`` on this node (a list: no shell quoting), ``--standalone``.
    ``python="torchrun"`` writes the console script; ``neuron_cores="4-7"`` gives local rank ``i`` the ``i``-th core;
    ``max_restarts=1``: torchrun restarts every rank once after a failure (run it with :data:`RESTART_ENV`)."""
    nproc_per_node = whole_number("nproc_per_node", plan_processes().nproc_per_node if nproc_per_node is None
                                  else nproc_per_node)
    cmd = ["torchrun"] if python == "torchrun" else [python or sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    if whole_number("max_restarts", max_restarts, minimum=0):
        cmd += [f"--max-restarts={max_restarts}"]
    if tee:
        cmd += ["--tee=3"]
    if neuron_cores is not None:  # the first nproc_per_node of them, one per rank
        cmd += ["-m", "trnlab.rank_cores", _format_core_list(rank_neuron_cores(nproc_per_node, neuron_cores))]
    return cmd + [str(a) for a in (script, *script_args)]


# Running the commands: stream every rank's lines live, stop every process of the run
_RANK_PREFIX_TEMPLATE = "[rank${rank}]: "  # torchrun prefixes each worker line with it (${rank}: the global rank)
_SUMMARY_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)")  # torchrun's failure summary, one field a line
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_TRACEBACK_START = "Traceback (most recent call last)"
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")  # torchrun's line, on each failure
_LAUNCH_ID_VAR = "TRNLAB_LAUNCH_ID"  # marks every process of one launch, so none can be left behind


@dataclass
class LaunchResult:
    """What one :func:`launch` produced: exit status, every line by rank, the failure if any; ``str()`` says it."""

    commands: list[list[str]]  # one torchrun command per launcher (node)
    returncode: int | None
    seconds: float
    rank_lines: dict[int, list[str]] = field(default_factory=dict)
    timed_out: bool = False
    failed_rank: int | None = None
    rank_exit_status: int | None = None  # the failed rank's own, when torchrun's summary gives it
    traceback: str = ""
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (rank, exit status) of each failure restarted

    @property
    def command(self) -> list[str]:
        return self.commands[0]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def lines(self, rank: int) -> list[str]:
        """The lines rank ``rank`` printed, in order, without the prefix."""
        return self.rank_lines.get(rank, [])

    def __str__(self) -> str:
        restarted = "".join(f", after rank {rank} failed ({_status(status)}) and torchrun restarted every rank"
                            for rank, status in self.restarts)
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s{restarted}; every process of the run was stopped"
        if self.ok:
            return f"the run finished (exit status 0) in {self.seconds:.1f} s{restarted}"
        who = f"rank {self.failed_rank}" if self.failed_rank is not None else "a rank"
        status = self.returncode if self.rank_exit_status is None else self.rank_exit_status
        return f"{who} failed (exit status {status}); torchrun stopped the other ranks"


def _status(code: int) -> str:
    """``exit status 1``, or ``exit status -9: SIGKILL`` for a process a signal ended."""
    return f"exit status {code}" + (f": {signal.Signals(-code).name}" if -code in signal.valid_signals() else "")


def _check_timeouts(timeout, grace) -> None:
    """Refuse a timeout or grace that is not a number of seconds > 0 (``timeout=None``: no limit)."""
    for name, value, optional in (("timeout", timeout, True), ("grace", grace, False)):
        if not (value is None and optional) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                 or not value > 0):  # NaN is not > 0 either
            raise SettingError(f"{name}={value!r}: give a number of seconds > 0"
                               + (" (or timeout=None for no limit)" if optional else ""))


def _stream(procs, lines: queue.Queue, result: LaunchResult, deadline: float | None, timeout, echo: bool,
            stop_all, failures: dict[int, int]) -> int | None:
    """Show each line as it comes, sorted into ``result`` by rank, until every launcher's output ends; stop all on
    timeout or failure. Fills ``failures`` (rank: exit status, every failure torchrun's summary lists, its root cause
    in ``result.failed_rank``). Returns the first rank that printed a traceback."""
    open_streams, many, first_traceback_rank = len(procs), len(procs) > 1, None
    in_traceback, section, listed = [False] * len(procs), None, None  # listed: the summary's rank being read
    while open_streams:
        remaining = None if deadline is None else max(0.01, deadline - time.monotonic())
        try:
            node, line = lines.get(timeout=remaining)
        except queue.Empty:
            result.timed_out = True
            if echo:
                print(f"[trnlab] TIMEOUT: the run did not end within {timeout:g} s (a hung collective? a rank "
                      f"waiting for one that died?); stopping every process of the run.", flush=True)
            stop_all()
            return first_traceback_rank
        if line is None:
            open_streams -= 1
            # One launcher failed: in a multi-node run the others would wait for it forever.
            if many and procs[node].wait() != 0:
                stop_all()
        elif match := _RANK_LINE.match(line):
            rank = int(match.group(1))
            # torch prefixes a rank's own log records and tracebacks with "[rankN]:" too.
            text = re.sub(rf"^\[rank{rank}\]: ?", "", match.group(2))
            result.rank_lines.setdefault(rank, []).append(text)
            if first_traceback_rank is None and text.startswith(_TRACEBACK_START):
                first_traceback_rank = rank
            if echo:
                print(line, flush=True)
        else:
            if match := _WORKER_FAILED.search(line):  # a restart, unless the summary follows (then it is popped)
                result.restarts.append((int(match.group(2)), int(match.group(1))))
            # torchrun's summary lists every failure it saw, with its exit status, and names a root cause.
            if line.strip() in ("Failures:", "Root Cause (first observed failure):"):
                section = line.strip()
            elif section and (match := _SUMMARY_FIELD.match(line)):
                if match.group(1) == "rank":
                    listed = int(match.group(2))
                    if section.startswith("Root"):
                        result.failed_rank = listed
                elif listed is not None:
                    failures[listed] = int(match.group(2))
            # torchrun ends a failed run with its own Python traceback (ChildFailedError): show the rank's instead.
            in_traceback[node] = in_traceback[node] or line.startswith(_TRACEBACK_START)
            if echo and not in_traceback[node] and line.strip():
                print(f"[torchrun node{node}] {line}" if many else f"[torchrun] {line}", flush=True)
    return first_traceback_rank


def _kill_marked(launch_id: str) -> bool:
    """Kill every live process whose environment carries this launch's id; whether any was found."""
    found = False
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # gone, a zombie, or not ours to read
            if proc.pid != os.getpid() and proc.environ().get(_LAUNCH_ID_VAR) == launch_id:
                proc.kill()
                found = True
    return found


def _stop(proc: subprocess.Popen, launch_id: str, grace: float) -> None:
    """SIGTERM torchrun's process group (it forwards it to the workers), SIGKILL it after ``grace`` s, then strays."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    # Workers run in their own sessions; anything still carrying our id is a stray.
    deadline = time.monotonic() + 5
    while _kill_marked(launch_id) and time.monotonic() < deadline:
        time.sleep(0.05)


def _run_commands(commands: list[list[str]], env: dict[str, str], timeout: float | None, grace: float,
                  echo: bool) -> LaunchResult:
    """Start every torchrun command at once, each in its own session, stream their merged lines, stop all on trouble
    (``timeout`` in seconds, ``None``: no limit; SIGTERM, SIGKILL after ``grace`` s): no process of the run is left."""
    launch_id, start = uuid.uuid4().hex, time.monotonic()
    child_env = {**os.environ, **env, _LAUNCH_ID_VAR: launch_id, "PYTHONUNBUFFERED": "1",
                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": _RANK_PREFIX_TEMPLATE}
    child_env.setdefault("OMP_NUM_THREADS", "1")  # torchrun would set it too, with a banner
    # The ranks import the same trnlab as this process, installed or not.
    package_root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                              env=child_env, start_new_session=True) for cmd in commands]
    lines: queue.Queue = queue.Queue()  # (node, line), then (node, None) at the end of its output

    def read(node: int, proc: subprocess.Popen):
        for line in proc.stdout:
            lines.put((node, line.rstrip("\n")))
        lines.put((node, None))

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for reader in readers:
        reader.start()
    result = LaunchResult(commands=commands, returncode=None, seconds=0.0)

    def stop_all():
        for proc in procs:
            _stop(proc, launch_id, grace)

    failures: dict[int, int] = {}
    try:
        first_traceback_rank = _stream(procs, lines, result, None if timeout is None else start + timeout, timeout,
                                       echo, stop_all, failures)
    except BaseException:  # KeyboardInterrupt (the notebook's stop button) included
        stop_all()
        raise
    finally:  # wait for the launchers (stopping any that linger), kill stragglers, end the reader threads
        for proc in procs:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                stop_all()
        _kill_marked(launch_id)
        for reader in readers:
            reader.join(timeout=5)
    result.seconds = time.monotonic() - start
    result.returncode = next((c for c in (p.returncode for p in procs) if c != 0), 0)
    if result.returncode != 0 and result.restarts and not result.timed_out:
        result.restarts.pop()  # the failure that ended the run, with no restart left
    if result.ok or result.timed_out:
        result.failed_rank = result.rank_exit_status = None
        return _report(result, echo)
    # A failed rank that printed no traceback (killed, a crash, os._exit) is the root cause, though a peer raised
    # about it first: which of them torchrun saw first, or at all, is chance (it stops the others when it sees one,
    # and lists those it stopped too, with -15: SIGTERM).
    silent = [r for r in failures if failures[r] != -signal.SIGTERM
              and not any(line.startswith(_TRACEBACK_START) for line in result.lines(r))]
    if result.failed_rank not in silent and silent:
        result.failed_rank = silent[0]
    result.rank_exit_status = failures.get(result.failed_rank)
    if first_traceback_rank is not None:
        # The root cause's traceback, else the first one a rank printed (about the root cause, as a rank whose peer
        # died sees it): torchrun stopped the others, without one.
        if result.failed_rank is None:
            result.failed_rank = first_traceback_rank
        said = result.lines(result.failed_rank)
        if not any(line.startswith(_TRACEBACK_START) for line in said):
            said = [f"(rank {result.failed_rank} printed no traceback; rank {first_traceback_rank}'s:)",
                    *result.lines(first_traceback_rank)]
        starts = [i for i, line in enumerate(said) if line.startswith(_TRACEBACK_START)]
        result.traceback = "\n".join(said[:1] * (said[0].startswith("(rank")) + said[starts[-1]:] if starts
                                     else said[-20:])
    return _report(result, echo)


def _report(result: LaunchResult, echo: bool) -> LaunchResult:
    """Say how the run ended, and the failed rank's traceback."""
    if echo:
        print(f"[trnlab] {result}", flush=True)
        if result.traceback:
            print(f"[trnlab] traceback of rank {result.failed_rank}:\n{result.traceback}", flush=True)
    return result


# Launching
def _launch_command(script, script_args=(), *, nproc_per_node=None, device=None, tp_size=None, fsdp_size=None,
                    model=None, neuron_cores=None, **options) -> tuple[list[str], ProcessPlan]:
    """The checked torchrun command of :func:`launch` on this machine, and its :class:`ProcessPlan`; nothing starts."""
    sizes = _mesh_sizes(tp_size, fsdp_size)
    if nproc_per_node is None and sizes is not None:
        nproc_per_node = math.prod(sizes)
    elif nproc_per_node is None and neuron_cores is not None:
        nproc_per_node = len(_listed_cores(neuron_cores))
    plan = plan_processes(nproc_per_node, device)
    if sizes is not None:
        validate_parallel_sizes(plan.nproc_per_node, *sizes, model_config=model)
    # TorchNeuron sets NEURON_RT_VISIBLE_CORES=LOCAL_RANK in each rank when it is unset (source snapshot,
    # trainium-facts), so only a subset needs trnlab.rank_cores: neuron_cores given, or the variable set here.
    if neuron_cores is None and plan.device == "neuron":
        neuron_cores = _visible_cores_setting()
    return torchrun_command(script, script_args, nproc_per_node=plan.nproc_per_node, neuron_cores=neuron_cores,
                            **options), plan


def launch(script, script_args=(), *, nproc_per_node: int | None = None, device: str | None = None,
           tp_size: int | None = None, fsdp_size: int | None = None, model=None, timeout: float | None = 600.0,
           env: dict[str, str] | None = None, echo: bool = True, check: bool = False, grace: float = 15.0,
           neuron_cores=None, max_restarts: int = 0) -> LaunchResult:
    """Run ``script`` under ``torchrun`` on this machine, streaming every rank's lines live; a :class:`LaunchResult`.
    Bad input raises :class:`SettingError` before anything starts, ``check=True`` a failed run :class:`LaunchError`;
    on all NeuronCores TorchNeuron gives each rank its own core (pre-release source snapshot); on a subset, trnlab."""
    _check_timeouts(timeout, grace)
    cmd, plan = _launch_command(script, script_args, nproc_per_node=nproc_per_node, device=device, tp_size=tp_size,
                                fsdp_size=fsdp_size, model=model, neuron_cores=neuron_cores, max_restarts=max_restarts)
    restart_env = RESTART_ENV if max_restarts else {}
    if echo:
        print(f"$ {shlex.join([*(f'{k}={v}' for k, v in restart_env.items()), *cmd])}\n  ({plan})", flush=True)
        listing = (_neuron_ls_json() or _neuron_ls_output()) if plan.device == "neuron" else None
        if _neuron_core_holders(listing):
            print(f"[trnlab] {core_holders_notice(listing, 'neuron')}", flush=True)
    result = _run_commands([cmd], {**plan.env, **restart_env, **(env or {})}, timeout, grace, echo)
    if check and not result.ok:
        error = LaunchError(str(result) + (f"\n{result.traceback}" if result.traceback else ""))
        error.result = result
        raise error
    return result


def launch_loopback_nodes(script, script_args=(), *, nnodes: int = 2, nproc_per_node: int = 1,
                          timeout: float | None = 300.0, echo: bool = True, grace: float = 15.0) -> LaunchResult:
    """Rehearse a multi-node run on this machine: ``nnodes`` torchrun launchers on 127.0.0.1.
    Each gets the static rendezvous of notebook 05's per-node lines; one gloo job; handling is :func:`launch`'s."""
    _check_timeouts(timeout, grace)
    nnodes, nproc_per_node = whole_number("nnodes", nnodes), whole_number("nproc_per_node", nproc_per_node)
    with socket.socket() as sock:  # a port free right now, for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    commands = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node}",
                 "--master-addr=127.0.0.1", f"--master-port={port}", f"--nproc-per-node={nproc_per_node}", "--tee=3",
                 *(str(a) for a in (script, *script_args))] for node in range(nnodes)]
    plan = plan_processes(nnodes * nproc_per_node, "cpu")
    if echo:
        for node, cmd in enumerate(commands):
            print(f"$ {shlex.join(cmd)}    # node {node}", flush=True)
    return _run_commands(commands, plan.env, timeout, grace, echo)
