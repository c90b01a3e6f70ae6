"""Launch a training script with ``torchrun`` from a notebook, and scale it past one machine.

The page's claim 10 ends with ``torchrun --nproc_per_node=4 train.py``. A notebook cannot
type that into a terminal for you, so :func:`launch` runs ``torchrun`` as a child process
(an argument list, never a shell string), streams every rank's output into the notebook as
it comes, each line prefixed ``[rank N]:``, and returns a :class:`LaunchResult` with the exit
status. When one rank fails, torchrun stops the others; :func:`launch` shows the failing
rank's traceback and makes sure no process of the run is left behind. A run that hangs ends
at ``timeout`` with a message that says so.

Before starting anything, :func:`validate_parallel_sizes` checks that the mesh fits the
launch (``tp_size * fsdp_size`` = number of processes) and the model (heads and layer widths
divide by ``tp_size``), and :func:`plan_processes` picks the process count and backend from
the machine: one process per NeuronCore (``neuron``) or GPU (``nccl``), a few on CPU (``gloo``).

One NeuronCore per rank: TorchNeuron's ``neuron`` process group sets each rank's
``NEURON_RT_VISIBLE_CORES`` to ``LOCAL_RANK`` when the variable is unset (its source, a
pre-release snapshot; see the course's trainium-facts), so torchrun on all cores needs nothing
from trnlab. Only a run on a subset of cores (``NEURON_RT_VISIBLE_CORES`` set in the launching
process, or ``neuron_cores=`` / ``--neuron-cores``) starts each rank through
:mod:`trnlab.rank_cores`, which gives it one core of the subset (:func:`needs_rank_cores`).
The tests check on CPU, and under the simulated trn2, which command is built and that each
rank sees only its core; none of it has been run on a trn2.

Past one machine, :func:`multinode_commands` writes one ``torchrun`` command per node, and
:func:`slurm_script` a Slurm batch script for a trn2 or trn3 cluster;
``python -m trnlab launch --dry-run ...`` prints them. Notebook 05 uses this module.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass, field
from pathlib import Path

from trnlab.device import (backend_available, detect_backend, device_count, format_core_holders,
                           neuron_core_holders, neuron_ls_output)
from trnlab.rank_cores import CoreListError, format_core_list, parse_core_list

#: torch.distributed backend for each device type (Transformers' ``DISTRIBUTED_BACKEND_MAP`` agrees).
DIST_BACKENDS = {"neuron": "neuron", "cuda": "nccl", "cpu": "gloo"}

#: Processes on CPU when nothing asks for more: enough to show a mesh, few enough for a laptop.
CPU_DEFAULT_PROCESSES = 2

def neuron_cores_per_node(instance: str) -> int:
    """Logical NeuronCores (one process each) on one node of ``instance``, e.g. 64 on trn2.48xlarge.

    Read from the planner's instance table (:data:`trnlab.planning.INSTANCES`, figures from the
    Neuron docs, one source for both): a Trainium2 chip has 8 physical NeuronCores, 4 logical
    ones at the default ``NEURON_LOGICAL_NC_CONFIG=2``; a trn2.3xlarge has 1 chip, a
    trn2.48xlarge 16. trn1 is refused: it has no native ``neuron`` device.
    """
    from trnlab.planning import PlanError, get_instance

    try:
        return get_instance(instance).cores_per_host
    except PlanError as exc:
        raise LaunchConfigError(str(exc)) from None


#: torchrun prefixes every line a worker prints with this (``${rank}`` is the global rank).
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")

#: Environment variable that marks every process of one launch, so none can be left behind.
LAUNCH_ID_VAR = "TRNLAB_LAUNCH_ID"


class LaunchConfigError(ValueError):
    """The requested mesh does not fit the launch or the model; the message names the fix."""


class LaunchError(RuntimeError):
    """A launched run failed or timed out (raised by :func:`launch` only with ``check=True``)."""

    def __init__(self, message: str, result: "LaunchResult"):
        super().__init__(message)
        self.result = result


# ---------------------------------------------------------------------------------------------
# How many processes, which backend
# ---------------------------------------------------------------------------------------------

def parse_neuron_cores(value: str, name: str = "NEURON_RT_VISIBLE_CORES") -> list[int]:
    """The NeuronCore numbers a core list names, in order: ``"0-3"`` -> ``[0, 1, 2, 3]``.

    The Neuron runtime accepts a single core (``"3"``), a range (``"0-3"``) or a list of both
    (``"0,1,4-5"``); :func:`launch`'s ``neuron_cores``, ``--neuron-cores`` and
    ``python -m trnlab.rank_cores`` take the same forms, through one parser
    (:func:`trnlab.rank_cores.parse_core_list`). A core named twice is refused.
    """
    try:
        return parse_core_list(value, name)
    except CoreListError as exc:
        raise LaunchConfigError(str(exc)) from None


def visible_neuron_cores(value: str | None = None) -> int | None:
    """How many NeuronCores ``NEURON_RT_VISIBLE_CORES`` allows (``None``: the variable is unset).

    ``value`` defaults to the environment variable; forms as in :func:`parse_neuron_cores`.
    """
    value = os.environ.get("NEURON_RT_VISIBLE_CORES") if value is None else value
    if value is None or not value.strip():
        return None
    return len(parse_neuron_cores(value))


def rank_neuron_cores(nproc: int, cores=None, visible: int | None = None) -> list[int]:
    """The NeuronCore of each local rank: rank ``i`` gets the ``i``-th core of ``cores``.

    ``cores``: a core list (``"4-7"``, ``"0,2"``, or a list of ints); ``None`` takes the cores
    this process may use, ``NEURON_RT_VISIBLE_CORES`` when set, else ``0 .. visible - 1``.
    The Neuron runtime reserves every core a process sees, so two ranks, or a rank and a
    notebook kernel, must never see the same one. On a subset of cores :func:`launch` runs
    each rank through :mod:`trnlab.rank_cores`, which sets that rank's
    ``NEURON_RT_VISIBLE_CORES`` to its core (see :func:`needs_rank_cores`).
    """
    if cores is None:
        from_env = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
        if from_env:
            listed = parse_neuron_cores(from_env)
        elif visible is not None:
            listed = list(range(visible))
        else:
            raise LaunchConfigError("no NeuronCores to give the ranks: pass neuron_cores='0-3' (the cores "
                                    "they may use) or set NEURON_RT_VISIBLE_CORES")
    elif isinstance(cores, str):
        listed = parse_neuron_cores(cores, "neuron_cores")
    else:
        if any(isinstance(c, bool) or not isinstance(c, int) for c in cores):
            raise LaunchConfigError(f"neuron_cores={cores!r}: give core numbers (ints) or a core list such as '0-3'")
        listed = [int(c) for c in cores]
        if any(c < 0 for c in listed) or len(set(listed)) != len(listed):
            raise LaunchConfigError(f"neuron_cores={cores!r}: give distinct core numbers >= 0, one per rank")
    if len(listed) < nproc:
        raise LaunchConfigError(
            f"{nproc} ranks need {nproc} NeuronCores, one each, but only {len(listed)} are given "
            f"({','.join(map(str, listed)) or 'none'}): name more cores, or launch fewer processes.")
    return listed[:nproc]


def needs_rank_cores(device: str, neuron_cores=None) -> bool:
    """Whether the ranks need :mod:`trnlab.rank_cores` to get one NeuronCore each.

    TorchNeuron's ``neuron`` process group sets ``NEURON_RT_VISIBLE_CORES=LOCAL_RANK`` in each
    rank when the variable is unset (source snapshot, see the course's trainium-facts), so plain
    torchrun on all cores needs nothing. A run on a subset does: ``neuron_cores`` is given, or
    this process has ``NEURON_RT_VISIBLE_CORES`` set (every rank would inherit the whole subset).
    Off Trainium only ``neuron_cores`` counts (a rehearsal of the assignment on CPU).
    """
    if neuron_cores is not None:
        return True
    return device == "neuron" and bool(os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip())


def _default_nproc(nproc_per_node, sizes, neuron_cores) -> int | None:
    """The process count asked for: given, else ``tp * fsdp``, else one per named core, else ``None``."""
    if nproc_per_node is not None:
        return nproc_per_node
    if sizes is not None:
        return math.prod(sizes)
    if neuron_cores is not None:
        return len(parse_neuron_cores(neuron_cores, "neuron_cores") if isinstance(neuron_cores, str)
                   else list(neuron_cores))
    return None


def _planned_rank_cores(plan: ProcessPlan, neuron_cores=None) -> list[int] | None:
    """The ranks' cores for ``plan`` when they need one each from us (:func:`needs_rank_cores`), else ``None``."""
    if not needs_rank_cores(plan.device, neuron_cores):
        return None
    return rank_neuron_cores(plan.nproc_per_node, neuron_cores, visible=plan.devices_visible)


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
        return (f"{self.nproc_per_node} process(es) on {self.device}, backend {self.dist_backend}: "
                f"{self.reason}")


def plan_processes(nproc: int | None = None, device: str | None = None) -> ProcessPlan:
    """Choose the process count and torch.distributed backend for this machine.

    * Trainium: one process per visible NeuronCore (``NEURON_RT_VISIBLE_CORES`` when set,
      else ``torch.neuron.device_count()``), backend ``neuron``.
    * GPUs: one process per GPU, backend ``nccl``.
    * CPU: ``gloo`` with :data:`CPU_DEFAULT_PROCESSES` processes, each with
      ``OMP_NUM_THREADS`` = its share of the cores so they do not fight over them.

    ``nproc`` asks for a number (e.g. ``tp_size * fsdp_size``); on an accelerator it may not
    exceed the devices, since two processes cannot share one NeuronCore or GPU. ``device``
    overrides detection. Used by :func:`launch` and notebook 05.
    """
    device = device or detect_backend()
    if device not in DIST_BACKENDS:
        raise LaunchConfigError(f"unknown device {device!r}: use one of {', '.join(DIST_BACKENDS)}")
    if nproc is not None and nproc < 1:
        raise LaunchConfigError(f"nproc={nproc}: launch at least one process")
    cpus = os.cpu_count() or 1
    if device == "cpu":
        chosen = nproc or CPU_DEFAULT_PROCESSES
        threads = max(1, cpus // chosen)
        reason = (f"no accelerator, so {chosen} CPU processes talk over gloo with "
                  f"OMP_NUM_THREADS={threads} each ({cpus} core(s) here)")
        if chosen > cpus:
            reason += "; more processes than cores, fine for a tiny model, slow for a real one"
        return ProcessPlan("cpu", "gloo", chosen, cpus, reason, {"OMP_NUM_THREADS": str(threads)})

    if not backend_available(device):
        raise LaunchConfigError(f"device={device!r} was requested but this machine has none: "
                                f"leave device=None to use what is here")
    if device == "neuron":
        from_env = visible_neuron_cores()
        visible = from_env if from_env is not None else device_count("neuron")
        source = ("NEURON_RT_VISIBLE_CORES=" + os.environ["NEURON_RT_VISIBLE_CORES"]
                  if from_env is not None else "torch.neuron.device_count()")
        what = "NeuronCore"
    else:
        visible, source, what = device_count("cuda"), "torch.cuda.device_count()", "GPU"
    chosen = nproc or visible
    if chosen > visible:
        hint = ("widen NEURON_RT_VISIBLE_CORES, " if device == "neuron" and from_env is not None else "")
        raise LaunchConfigError(
            f"{chosen} processes need {chosen} {what}s but {source} gives {visible}: {hint}"
            f"lower tp_size * fsdp_size to at most {visible}, or add nodes (nnodes).")
    reason = f"one process per {what}, {visible} visible ({source})"
    if chosen < visible:
        reason += f"; {visible - chosen} left idle because the mesh needs {chosen}"
    return ProcessPlan(device, DIST_BACKENDS[device], chosen, visible, reason)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def model_config_of(model=None):
    """The Transformers config of ``model``: a config object, a name or folder, or ``None``.

    ``None`` is the course's model (``TRNLAB_MODEL`` or the bundled tiny Qwen3). Cheap (no
    weights) and offline for the Qwen3 configs shipped in ``trnlab/assets/configs``: the same
    lookup as ``python -m trnlab plan`` (:func:`trnlab.planning.resolve_config`).
    :func:`validate_parallel_sizes` checks a mesh against it; a model with no config to be
    found raises :class:`LaunchConfigError` saying where it looked.
    """
    if hasattr(model, "num_attention_heads") or hasattr(model, "get_text_config"):
        return model
    from trnlab.models import ModelNotAvailableError
    from trnlab.planning import PlanError, resolve_config

    try:
        return resolve_config(model)[0]
    except (PlanError, ModelNotAvailableError) as exc:
        raise LaunchConfigError(f"cannot check the mesh against model {model!r}: {exc}") from None


def validate_parallel_sizes(world_size: int, tp_size: int = 1, fsdp_size: int = 1, *,
                            dp_replicate_size: int = 1, pp_size: int = 1,
                            model_config=None, check_model: bool = True) -> dict:
    """Check a ``DistributedConfig`` layout against the launch and the model, before launching.

    * ``pp_size * dp_replicate_size * fsdp_size * tp_size`` must equal ``world_size`` (the
      number of processes over all nodes): Transformers builds exactly that mesh.
    * Tensor parallelism gives each rank whole attention heads and a slice of every sharded
      layer, so ``num_attention_heads``, ``num_key_value_heads`` and the MLP width
      (``intermediate_size``) must divide by ``tp_size``; pipeline stages take whole layers,
      so ``num_hidden_layers`` must divide by ``pp_size``.
    * With tied embeddings and FSDP, ``vocab_size`` must divide by ``tp_size * fsdp_size``
      (see :func:`trnlab.distributed.pad_vocabulary` for the silent failure this prevents).

    ``model_config`` is a Transformers config or a model name or folder; ``None`` means the
    course's model (``TRNLAB_MODEL`` or the bundled one), as :func:`launch` uses.
    ``check_model=False`` skips the model checks, explicitly. Raises
    :class:`LaunchConfigError` naming the numbers to change; returns the checked sizes.
    """
    sizes = {"pp_size": pp_size, "dp_replicate_size": dp_replicate_size,
             "fsdp_size": fsdp_size, "tp_size": tp_size}
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise LaunchConfigError(f"{name}={value!r}: every parallel size is a whole number >= 1")
    product = math.prod(sizes.values())
    if product != world_size:
        shown = ["tp_size", "fsdp_size", "dp_replicate_size", "pp_size"]
        used = " * ".join(f"{k}={sizes[k]}" for k in shown if sizes[k] != 1 or k in ("tp_size", "fsdp_size"))
        pairs = [f"tp_size={t}, fsdp_size={world_size // t}" for t in _divisors(world_size)
                 if world_size % (t * pp_size * dp_replicate_size) == 0][:4]
        raise LaunchConfigError(
            f"{used} = {product}, but the launch has {world_size} process(es): the mesh needs exactly "
            f"one process per position. Either launch {product} processes (nproc_per_node * nnodes = "
            f"{product}), or change the sizes so their product is {world_size}"
            + (f" (e.g. {'; '.join(pairs)})." if pairs and pp_size == dp_replicate_size == 1 else "."))

    config = model_config_of(model_config) if check_model else None
    if config is not None:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        checks = [("num_attention_heads", "attention heads"), ("num_key_value_heads", "key/value heads"),
                  ("intermediate_size", "MLP width (intermediate_size)")]
        dims = {attr: getattr(text_config, attr, None) for attr, _ in checks}
        dims = {k: v for k, v in dims.items() if isinstance(v, int)}
        bad = [(attr, label, dims[attr]) for attr, label in checks if attr in dims and dims[attr] % tp_size]
        if bad:
            fits = [t for t in _divisors(world_size) if all(v % t == 0 for v in dims.values())]
            what = ", ".join(f"{label} = {value}" for _, label, value in bad)
            raise LaunchConfigError(
                f"tp_size={tp_size} does not divide the model's {what}: each tensor-parallel rank "
                f"must get whole heads and an equal slice. Use tp_size in {fits} (and fsdp_size = "
                f"{world_size} // tp_size), or a model whose heads divide by {tp_size}.")
        vocab = getattr(text_config, "vocab_size", None)
        shards = tp_size * fsdp_size
        tied = getattr(config, "tie_word_embeddings", getattr(text_config, "tie_word_embeddings", False))
        if tied and fsdp_size * dp_replicate_size > 1 and isinstance(vocab, int) and vocab % shards:
            raise LaunchConfigError(
                f"vocab_size={vocab} does not divide by tp_size * fsdp_size = {shards}: the tied "
                f"embedding's rows would be split unevenly, and with tied embeddings under FSDP2 "
                f"(Transformers 5.24) the padded ranks train lm_head from a stale copy, so the loss "
                f"silently drifts from a one-process run. Pad the vocabulary first: "
                f"trnlab.distributed.pad_vocabulary(model, folder, multiple=64) (any multiple of "
                f"{shards}), or use fsdp_size=1.")
        layers = getattr(text_config, "num_hidden_layers", None)
        if isinstance(layers, int) and layers % pp_size:
            raise LaunchConfigError(
                f"pp_size={pp_size} does not divide num_hidden_layers={layers}: use pp_size in "
                f"{_divisors(layers)}.")
    return sizes


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def _script_argv(script, script_args=(), module: bool = False) -> list[str]:
    return (["-m", str(script)] if module else [str(script)]) + [str(a) for a in script_args]


def torchrun_command(script, script_args=(), *, nproc_per_node: int | None = None, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str | None = None,
                     rdzv_backend: str = "static", rdzv_id: str = "trnlab", module: bool = False,
                     python: str | None = None, tee: bool = True, neuron_cores=None) -> list[str]:
    """The ``torchrun`` argument list that runs ``script`` on this node (a list: no shell quoting).

    ``nproc_per_node=None`` takes :func:`plan_processes`' choice for this machine: one
    process per NeuronCore or GPU, two on CPU. One node without an endpoint uses
    ``--standalone`` (a private rendezvous on a free port). More nodes meet at
    ``rdzv_endpoint`` (``HOST:PORT`` on node 0, reachable from every node):

    * ``rdzv_backend="static"`` (default): ``--nnodes --node-rank --master-addr --master-port``;
      node ``i`` holds global ranks ``i * nproc_per_node ...``, node 0 hosts the store.
    * ``rdzv_backend="c10d"``: ``--rdzv-backend=c10d --rdzv-endpoint --rdzv-id``; elastic,
      ranks are assigned as nodes arrive and torchrun ignores ``--node-rank``, so none is given.

    ``python=None`` runs torchrun as ``python -m torch.distributed.run`` with this
    interpreter; ``"torchrun"`` writes the console script, as a cluster script would.
    ``tee`` asks torchrun to prefix every worker line with its rank (``--tee=3``).
    ``neuron_cores`` (e.g. ``"4-7"``) starts each rank through :mod:`trnlab.rank_cores`, which
    gives local rank ``i`` only the ``i``-th core of the list: needed only on a subset of the
    cores (plain torchrun on all cores needs nothing, see :func:`needs_rank_cores`); it is
    exactly what you pass, never added here. For every node of a multi-node run at once, see
    :func:`multinode_commands`.
    """
    if nproc_per_node is None:
        nproc_per_node = plan_processes().nproc_per_node
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise LaunchConfigError(f"nproc_per_node={nproc_per_node!r}: give a whole number of processes >= 1")
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise LaunchConfigError(f"nnodes={nnodes!r}: give a whole number of nodes >= 1")
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise LaunchConfigError(f"node_rank={node_rank!r} with nnodes={nnodes}: node ranks run from 0 to "
                                f"{nnodes - 1}, one per node")
    cmd = ["torchrun"] if python == "torchrun" else [python or sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone"]
    else:
        if rdzv_endpoint is None or ":" not in rdzv_endpoint:
            raise LaunchConfigError("a multi-node run needs rdzv_endpoint='HOST:PORT' on node 0, "
                                    f"got {rdzv_endpoint!r}")
        if rdzv_backend == "static":
            host, _, port = rdzv_endpoint.rpartition(":")
            cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={host}",
                    f"--master-port={port}"]
        elif rdzv_backend == "c10d":
            cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                    f"--rdzv-id={rdzv_id}"]
        else:
            raise LaunchConfigError(f"rdzv_backend={rdzv_backend!r}: use 'static' or 'c10d'")
    cmd += [f"--nproc-per-node={nproc_per_node}"]
    if tee:
        cmd += ["--tee=3"]
    if neuron_cores is not None:
        cores = rank_neuron_cores(nproc_per_node, neuron_cores)  # the first nproc_per_node of them
        cmd += ["-m", "trnlab.rank_cores", format_core_list(cores)]
    return cmd + _script_argv(script, script_args, module)


def multinode_commands(script, script_args=(), *, nnodes: int, nproc_per_node: int | None = None,
                       rdzv_endpoint: str | None = None, rdzv_backend: str = "static", rdzv_id: str = "trnlab",
                       module: bool = False, python: str | None = "torchrun",
                       tee: bool = False, neuron_cores=None) -> list[list[str]]:
    """One ``torchrun`` command per node (list index = ``--node-rank``), from one node up.

    Run command ``i`` on node ``i``; with two or more nodes, node 0 hosts the rendezvous at
    ``rdzv_endpoint`` (its address and a free port every node can reach). Together they form
    one job of ``nnodes * nproc_per_node`` ranks (``nproc_per_node=None``: this machine's
    choice, :func:`plan_processes`). With ``nnodes=1`` it is ``[torchrun_command(...)]``.
    ``neuron_cores`` (e.g. ``"0-31"``) applies on every node: each node's local rank ``i``
    gets the ``i``-th core of that node (:mod:`trnlab.rank_cores`).
    Notebook 05 prints these for a trn2 cluster; :func:`launch_loopback_nodes` runs them all
    on this machine.
    """
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise LaunchConfigError(f"nnodes={nnodes!r}: give a whole number of nodes >= 1")
    if nnodes > 1 and rdzv_endpoint is None:
        raise LaunchConfigError(f"a run on {nnodes} nodes needs rdzv_endpoint='HOST:PORT': the address of "
                                "node 0 and a free port every node can reach")
    return [torchrun_command(script, script_args, nproc_per_node=nproc_per_node, nnodes=nnodes,
                             node_rank=i, rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend,
                             rdzv_id=rdzv_id, module=module, python=python, tee=tee,
                             neuron_cores=neuron_cores)
            for i in range(nnodes)]


def slurm_script(script, script_args=(), *, nnodes: int, instance: str = "trn2.48xlarge",
                 nproc_per_node: int | None = None, port: int = 29500, job_name: str = "trnlab",
                 venv: str | None = None, module: bool = False, neuron_cores=None) -> str:
    """A Slurm batch script (``sbatch``) that runs ``script`` on ``nnodes`` Trainium nodes.

    Slurm starts one task per node (``srun --ntasks-per-node=1``); each task runs torchrun
    with one process per NeuronCore (:func:`neuron_cores_per_node`, or ``nproc_per_node``)
    and rendezvous at the first node of the allocation. ``$SLURM_NODEID`` is expanded inside
    each task, so every node gets its own ``--node-rank``. ``venv``: a virtual environment to
    activate on every node (e.g. the Neuron venv); it must exist on every node, as must the script.
    ``neuron_cores`` (e.g. ``"0-31"``): run on those cores of every node only, one per rank,
    through :mod:`trnlab.rank_cores` (trnlab must then be installed on every node);
    ``nproc_per_node`` defaults to their number. Refused before anything is written: trn1,
    ``nnodes < 1``, more processes or higher core numbers than a node of ``instance`` has.
    """
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise LaunchConfigError(f"nnodes={nnodes!r}: give a whole number of nodes >= 1")
    cores_per_node = neuron_cores_per_node(instance)  # refuses trn1 and unknown instances
    cores = None
    if neuron_cores is not None:
        cores = (parse_neuron_cores(neuron_cores, "neuron_cores") if isinstance(neuron_cores, str)
                 else rank_neuron_cores(len(list(neuron_cores)), list(neuron_cores)))
        if max(cores) >= cores_per_node:
            raise LaunchConfigError(f"neuron_cores={neuron_cores!r} names core {max(cores)}, but a {instance} "
                                    f"node has cores 0-{cores_per_node - 1}")
    if nproc_per_node is None:
        nproc_per_node = len(cores) if cores is not None else cores_per_node
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise LaunchConfigError(f"nproc_per_node={nproc_per_node!r}: give a whole number of processes >= 1")
    if nproc_per_node > cores_per_node:
        raise LaunchConfigError(f"nproc_per_node={nproc_per_node}: a {instance} node has {cores_per_node} "
                                f"NeuronCores, one process each. Use at most {cores_per_node} per node and "
                                f"more nodes (nnodes) for more ranks.")
    worker_argv = _script_argv(script, script_args, module)
    if cores is not None:
        worker_argv = ["-m", "trnlab.rank_cores",
                       format_core_list(rank_neuron_cores(nproc_per_node, cores))] + worker_argv
    worker = shlex.join(worker_argv)
    activate = f"source {shlex.quote(venv + '/bin/activate')}\n" if venv else ""
    # The single-quoted part expands on each node, inside its own srun task ($SLURM_NODEID);
    # the script and its arguments follow as "$@", quoted once, here.
    per_node = ("'exec torchrun --nnodes=\"$SLURM_NNODES\" --node-rank=\"$SLURM_NODEID\" "
                f"--master-addr=\"$HEAD_NODE\" --master-port={port} --nproc-per-node={nproc_per_node} "
                "\"$@\"' torchrun-on-node")
    cores_note = ("" if cores is None else "\n# Each rank gets its own core of "
                  f"{format_core_list(rank_neuron_cores(nproc_per_node, cores))} through trnlab.rank_cores "
                  "(trnlab installed on every node).")
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
# {nnodes} x {instance}: {nproc_per_node} processes (NeuronCores) per node, {nnodes * nproc_per_node} ranks.{cores_note}
# Multi-node Neuron runs need EFA installed and configured on every node (Neuron setup guide).
set -euo pipefail
{activate}export HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 bash -c {per_node} {worker}
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for a loopback rendezvous)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------

@dataclass
class LaunchResult:
    """What one :func:`launch` produced: exit status, every line by rank, the failure if any."""

    commands: list[list[str]]  # one torchrun command per launcher (node)
    returncode: int | None
    seconds: float
    rank_lines: dict[int, list[str]] = field(default_factory=dict)
    launcher_lines: list[str] = field(default_factory=list)
    timed_out: bool = False
    failed_rank: int | None = None
    traceback: str = ""
    strays_killed: int = 0

    @property
    def command(self) -> list[str]:
        return self.commands[0]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def lines(self, rank: int) -> list[str]:
        """The lines rank ``rank`` printed, in order, without the prefix."""
        return self.rank_lines.get(rank, [])

    def summary(self) -> str:
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s; every process of the run was stopped"
        if self.ok:
            return f"the run finished (exit status 0) in {self.seconds:.1f} s"
        who = f"rank {self.failed_rank}" if self.failed_rank is not None else "a rank"
        return f"{who} failed (exit status {self.returncode}); torchrun stopped the other ranks"


def _marked_processes(launch_id: str) -> list:
    """Live processes whose environment carries this launch's id (psutil: Linux, macOS, Windows)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(LAUNCH_ID_VAR) == launch_id:
                found.append(proc)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
    return found


def _kill_marked(launch_id: str) -> int:
    import psutil

    killed = 0
    for proc in _marked_processes(launch_id):
        try:
            proc.kill()
            killed += 1
        except psutil.Error:
            pass
    return killed


def _stop(proc: subprocess.Popen, launch_id: str, grace: float) -> int:
    """SIGTERM torchrun's process group (it forwards it to the workers), then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    # Workers run in their own sessions; anything still carrying our id is a stray.
    killed = _kill_marked(launch_id)
    deadline = time.monotonic() + 5
    while _marked_processes(launch_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def _extract_traceback(lines: list[str]) -> str:
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    return "\n".join(lines[starts[-1]:]) if starts else "\n".join(lines[-20:])


def _check_timeouts(timeout, grace) -> None:
    """Refuse a timeout or grace that is not a number of seconds > 0 (``timeout=None``: no limit)."""
    for name, value, optional in (("timeout", timeout, True), ("grace", grace, False)):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
            raise LaunchConfigError(f"{name}={value!r}: give a number of seconds > 0"
                                    + (" (or timeout=None for no limit)" if optional else ""))


def _mesh_sizes(tp_size, fsdp_size) -> tuple[int, int] | None:
    """``(tp_size, fsdp_size)`` with 1 for one not given; ``None`` when neither is given.

    A size of 0 or less is refused here, never read as 1.
    """
    if tp_size is None and fsdp_size is None:
        return None
    sizes = (1 if tp_size is None else tp_size, 1 if fsdp_size is None else fsdp_size)
    for name, value in zip(("tp_size", "fsdp_size"), sizes):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LaunchConfigError(f"{name}={value!r}: every parallel size is a whole number >= 1 "
                                    "(leave it out for 1)")
    return sizes


def _run_launchers(commands: list[list[str]], env: dict[str, str], timeout: float | None, grace: float,
                   echo: bool) -> LaunchResult:
    """Start every torchrun command at once, stream their merged lines, stop all on trouble."""
    launch_id = uuid.uuid4().hex
    child_env = {**os.environ, **env, LAUNCH_ID_VAR: launch_id, "PYTHONUNBUFFERED": "1",
                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX_TEMPLATE}
    child_env.setdefault("OMP_NUM_THREADS", "1")  # torchrun would set it too, with a banner
    # The ranks import the same trnlab as this process, installed or not.
    package_root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    many = len(commands) > 1
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              bufsize=1, env=child_env, start_new_session=True) for cmd in commands]
    lines: queue.Queue = queue.Queue()

    def read(node: int, proc: subprocess.Popen):
        for line in proc.stdout:
            lines.put((node, line.rstrip("\n")))
        lines.put((node, None))

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for reader in readers:
        reader.start()
    result = LaunchResult(commands=commands, returncode=None, seconds=0.0)
    in_traceback = [False] * len(procs)
    first_traceback_rank = None  # the first rank to print a traceback: the root cause
    open_streams = len(procs)

    def stop_all():
        result.strays_killed += sum(_stop(p, launch_id, grace) for p in procs)

    try:
        while open_streams:
            remaining = None if timeout is None else max(0.01, start + timeout - time.monotonic())
            try:
                node, line = lines.get(timeout=remaining)
            except queue.Empty:
                result.timed_out = True
                if echo:
                    print(f"[trnlab] TIMEOUT: the run did not end within {timeout:g} s (a hung "
                          f"collective? a rank waiting for one that died?); stopping every process "
                          f"of the run.", flush=True)
                stop_all()
                break
            if line is None:
                open_streams -= 1
                # One launcher failed: in a multi-node run the others would wait for it forever.
                if many and procs[node].wait() != 0:
                    stop_all()
                continue
            match = _RANK_LINE.match(line)
            if match:
                # torch prefixes a rank's own log records and tracebacks with "[rankN]:" too.
                text = re.sub(rf"^\[rank{match.group(1)}\]: ?", "", match.group(2))
                result.rank_lines.setdefault(int(match.group(1)), []).append(text)
                if first_traceback_rank is None and text.startswith("Traceback (most recent"):
                    first_traceback_rank = int(match.group(1))
                shown = line
            else:
                result.launcher_lines.append(line)
                # torchrun ends a failed run with its own Python traceback (ChildFailedError):
                # keep it in the result, show the rank's own traceback instead.
                in_traceback[node] = in_traceback[node] or line.startswith("Traceback (most recent")
                label = f"[torchrun node{node}]" if many else "[torchrun]"
                shown = None if in_traceback[node] or not line.strip() else f"{label} {line}"
            if echo and shown is not None:
                print(shown, flush=True)
    except BaseException:  # KeyboardInterrupt (the notebook's stop button) included
        stop_all()
        raise
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                stop_all()
        result.strays_killed += _kill_marked(launch_id)
        for reader in readers:
            reader.join(timeout=5)
    codes = [p.returncode for p in procs]
    result.returncode = next((c for c in codes if c != 0), 0)
    result.seconds = time.monotonic() - start

    if not result.ok and not result.timed_out:
        # The rank that raised first: the others are stopped by torchrun after it, without one.
        result.failed_rank = first_traceback_rank
        if result.failed_rank is not None:
            result.traceback = _extract_traceback(result.lines(result.failed_rank))
    if echo:
        print(f"[trnlab] {result.summary()}", flush=True)
        if result.traceback:
            print(f"[trnlab] traceback of rank {result.failed_rank}:\n{result.traceback}", flush=True)
    return result


def launch(script, script_args=(), *, nproc_per_node: int | None = None, device: str | None = None,
           tp_size: int | None = None, fsdp_size: int | None = None, model=None,
           timeout: float | None = 600.0, env: dict[str, str] | None = None, module: bool = False,
           echo: bool = True, check: bool = False, grace: float = 15.0, neuron_cores=None) -> LaunchResult:
    """Run ``script`` under ``torchrun`` on this machine, streaming every rank's lines live.

    * Process count and backend come from :func:`plan_processes` (``nproc_per_node`` defaults
      to ``tp_size * fsdp_size`` when those are given, else to one per core of
      ``neuron_cores``). With ``tp_size``/``fsdp_size``, :func:`validate_parallel_sizes` checks
      them against the processes and the model's config (``model``: a name or config, ``None``
      for the course model; shipped Qwen3 configs work offline) before anything starts.
    * Every line is printed as it arrives, prefixed ``[rankN]:`` by torchrun (``--tee=3``);
      the launcher's own lines are prefixed ``[torchrun]``. Returns a :class:`LaunchResult`;
      ``result.returncode`` is torchrun's exit status, ``result.lines(rank)`` a rank's output.
    * A failing rank: torchrun stops the others; its traceback is printed once more at the
      end, plainly, and kept in ``result.traceback``. After ``timeout`` seconds the run is
      stopped (SIGTERM to torchrun's process group, SIGKILL after ``grace`` s);
      ``timeout=None`` waits as long as the run takes. In every case
      no process of the run is left: each carries a launch id in its environment
      (:data:`LAUNCH_ID_VAR`) and stragglers are killed.
    * ``check=True`` raises :class:`LaunchError` instead of returning a failed result.
    * Trainium, one NeuronCore per rank: on all cores, plain torchrun, since TorchNeuron's
      process group sets each rank's ``NEURON_RT_VISIBLE_CORES`` to ``LOCAL_RANK`` when it is
      unset (a source snapshot says so; not run on a trn2 by this course). On a subset (this
      process has ``NEURON_RT_VISIBLE_CORES`` set, or ``neuron_cores`` is given), each rank
      starts through :mod:`trnlab.rank_cores` and gets the ``i``-th core of the subset
      (:func:`rank_neuron_cores`), because a shared value would give every rank all of them.
      Processes that ``neuron-ls`` lists as holding Neuron devices (an old notebook kernel) are
      named before the start. Elsewhere ``neuron_cores`` is only handed to the ranks, which
      rehearses the assignment on CPU.

    Bad input (sizes < 1, a mesh that does not fit, a timeout that is not > 0) raises
    :class:`LaunchConfigError` before any process starts.
    """
    _check_timeouts(timeout, grace)
    sizes = _mesh_sizes(tp_size, fsdp_size)
    plan = plan_processes(_default_nproc(nproc_per_node, sizes, neuron_cores), device)
    if sizes is not None:
        validate_parallel_sizes(plan.nproc_per_node, *sizes, model_config=model)
    cmd = torchrun_command(script, script_args, nproc_per_node=plan.nproc_per_node, module=module,
                           neuron_cores=_planned_rank_cores(plan, neuron_cores))
    if echo:
        print(f"$ {shlex.join(cmd)}\n  ({plan})", flush=True)
    if plan.device == "neuron":
        holders = neuron_core_holders(neuron_ls_output())
        if holders and echo:
            print(f"[trnlab] neuron-ls lists processes that hold Neuron devices: {format_core_holders(holders)}. "
                  "A process keeps every NeuronCore it saw until it exits: if a rank cannot initialize the "
                  "runtime, shut that one down (a notebook kernel: Kernel > Shut Down Kernel), or pass "
                  "neuron_cores= cores it does not hold.", flush=True)
    result = _run_launchers([cmd], {**plan.env, **(env or {})}, timeout, grace, echo)
    if check and not result.ok:
        raise LaunchError(result.summary() + (f"\n{result.traceback}" if result.traceback else ""), result)
    return result


def launch_loopback_nodes(script, script_args=(), *, nnodes: int = 2, nproc_per_node: int = 1,
                          rdzv_backend: str = "static", timeout: float | None = 300.0,
                          env: dict[str, str] | None = None, module: bool = False,
                          echo: bool = True, grace: float = 15.0) -> LaunchResult:
    """Rehearse a multi-node run on this machine: ``nnodes`` torchrun launchers on 127.0.0.1.

    The launchers get exactly the :func:`multinode_commands` a cluster would (rendezvous at
    ``127.0.0.1:<free port>``) and form one job of ``nnodes * nproc_per_node`` ranks on gloo.
    Output, failure and timeout handling are those of :func:`launch`; if one launcher fails,
    the others are stopped too. Used by the tests and notebook 05.
    """
    _check_timeouts(timeout, grace)
    endpoint = f"127.0.0.1:{free_port()}"
    commands = multinode_commands(script, script_args, nnodes=nnodes, nproc_per_node=nproc_per_node,
                                  rdzv_endpoint=endpoint, rdzv_backend=rdzv_backend,
                                  rdzv_id=f"loopback-{uuid.uuid4().hex[:8]}", module=module,
                                  python=None, tee=True)
    plan = plan_processes(nnodes * nproc_per_node, "cpu")
    if echo:
        for node, cmd in enumerate(commands):
            print(f"$ {shlex.join(cmd)}    # node {node}", flush=True)
    return _run_launchers(commands, {**plan.env, **(env or {})}, timeout, grace, echo)


# ---------------------------------------------------------------------------------------------
# Command line: python -m trnlab launch
# ---------------------------------------------------------------------------------------------

def _timeout_arg(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (or 'none')") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab launch [options] SCRIPT [ARGS...]``: run, or print, a torchrun launch."""
    parser = argparse.ArgumentParser(
        prog="python -m trnlab launch",
        description="Launch SCRIPT with torchrun on this machine, or print the commands for a "
                    "multi-node run or a Slurm batch script (--dry-run).")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="processes per node (default: one per NeuronCore/GPU, or tp*fsdp, or 2 on CPU)")
    parser.add_argument("--tp-size", type=int, default=None)
    parser.add_argument("--fsdp-size", type=int, default=None)
    parser.add_argument("--model", default=None,
                        help="model whose config is checked (default: TRNLAB_MODEL or the course model)")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0 (multi-node)")
    parser.add_argument("--rdzv-backend", default="static", choices=["static", "c10d"])
    parser.add_argument("--slurm", action="store_true", help="print a Slurm batch script (implies --dry-run)")
    parser.add_argument("--instance", default="trn2.48xlarge",
                        help="Trainium instance of every node, for --slurm (trn2/trn3; see python -m trnlab plan)")
    parser.add_argument("--neuron-cores", default=None,
                        help="run on these NeuronCores only, one per rank, e.g. 4-7 (on every node with "
                             "--nnodes/--slurm). Default on Trainium: all cores (TorchNeuron gives rank i "
                             "core i), or this shell's NEURON_RT_VISIBLE_CORES when set")
    parser.add_argument("--timeout", type=_timeout_arg, default=3600.0,
                        help="seconds before the run is stopped (default 3600; 'none': no limit)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    from trnlab.planning import PlanError
    from trnlab.settings import SettingError

    try:
        return _run_cli(args)
    except (LaunchConfigError, PlanError, SettingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run_cli(args: argparse.Namespace) -> int:
    """``main``'s work once the arguments are parsed: every bad value raises before anything runs."""
    if isinstance(args.nnodes, int) and args.nnodes < 1:
        raise LaunchConfigError(f"--nnodes {args.nnodes}: give the number of nodes, 1 or more")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise LaunchConfigError(f"--nproc-per-node {args.nproc_per_node}: give 1 or more processes per node")
    sizes = _mesh_sizes(args.tp_size, args.fsdp_size)
    if args.slurm:
        nproc = args.nproc_per_node
        if sizes is not None:
            per_node = nproc or (len(parse_neuron_cores(args.neuron_cores, "--neuron-cores")) if args.neuron_cores
                                 else neuron_cores_per_node(args.instance))
            validate_parallel_sizes(per_node * args.nnodes, *sizes, model_config=args.model)
        print(slurm_script(args.script, args.script_args, nnodes=args.nnodes, instance=args.instance,
                           nproc_per_node=nproc, neuron_cores=args.neuron_cores), end="")
        return 0
    if args.nnodes > 1:
        if args.nproc_per_node is None:
            raise LaunchConfigError("a multi-node run needs --nproc-per-node (the processes on each node)")
        if sizes is not None:
            validate_parallel_sizes(args.nproc_per_node * args.nnodes, *sizes, model_config=args.model)
        commands = multinode_commands(args.script, args.script_args, nnodes=args.nnodes,
                                      nproc_per_node=args.nproc_per_node,
                                      rdzv_endpoint=args.rdzv_endpoint or "NODE0_ADDRESS:29500",
                                      rdzv_backend=args.rdzv_backend, neuron_cores=args.neuron_cores)
        for node, cmd in enumerate(commands):
            print(f"# on node {node}:\n{shlex.join(cmd)}")
        if not args.dry_run:
            print("(not started: run each command on its node, or submit --slurm's script)", file=sys.stderr)
        return 0
    if args.dry_run:
        plan = plan_processes(_default_nproc(args.nproc_per_node, sizes, args.neuron_cores))
        if sizes is not None:
            validate_parallel_sizes(plan.nproc_per_node, *sizes, model_config=args.model)
        print(shlex.join(torchrun_command(args.script, args.script_args, nproc_per_node=plan.nproc_per_node,
                                          python="torchrun", tee=False,
                                          neuron_cores=_planned_rank_cores(plan, args.neuron_cores))))
        print(f"# {plan}")
        if sizes is not None:
            from trnlab.planning import format_plan, plan_memory

            memory = plan_memory(args.model, *sizes, workload="train")
            print("# " + format_plan(memory).replace("\n", "\n# "))
        return 0
    result = launch(args.script, args.script_args, nproc_per_node=args.nproc_per_node,
                    tp_size=args.tp_size, fsdp_size=args.fsdp_size, model=args.model,
                    timeout=args.timeout, neuron_cores=args.neuron_cores)
    return result.returncode if result.returncode is not None else 1
