"""Build the ``torchrun`` commands that launch a training script, from one node to a cluster.

The page's claim 10 ends with ``torchrun --nproc_per_node=4 train.py``. This module builds that
command for this machine and past it, as pure functions of their arguments and of what the
machine offers; :mod:`trnlab.runner` starts, streams and stops the processes:

* :func:`plan_processes` picks the process count and backend from the machine: one process
  per NeuronCore (``neuron``) or GPU (``nccl``), a few on CPU (``gloo``).
* :func:`launch_command` is Accelerate's ``prepare_simple_launcher_cmd_env``: the checked
  ``(cmd, env)`` of a launch on this machine, with its :class:`ProcessPlan`. The mesh is
  checked first (:func:`trnlab.mesh.validate_parallel_sizes`: ``tp_size * fsdp_size`` =
  number of processes, heads and layer widths divide by ``tp_size``).
* :func:`torchrun_command` is one node's argument list (never a shell string);
  :func:`multinode_commands` one per node; :func:`slurm_script` a Slurm batch script for a trn2
  or trn3 cluster. ``python -m trnlab launch --dry-run ...`` prints them.
* :func:`launch` and :func:`launch_loopback_nodes` hand those commands to
  :func:`trnlab.runner.run_commands`, which streams every rank's output into the notebook,
  each line prefixed ``[rank N]:``, and returns a :class:`~trnlab.runner.LaunchResult`.

One NeuronCore per rank: TorchNeuron's ``neuron`` process group sets each rank's
``NEURON_RT_VISIBLE_CORES`` to ``LOCAL_RANK`` when the variable is unset (its source, a
pre-release snapshot; see the course's trainium-facts), so torchrun on all cores needs nothing
from trnlab. Only a run on a subset of cores (``NEURON_RT_VISIBLE_CORES`` set in the launching
process, or ``neuron_cores=`` / ``--neuron-cores``) starts each rank through
:mod:`trnlab.rank_cores`, which gives it one core of the subset (:func:`needs_rank_cores`).
The tests check on CPU, and under the simulated trn2, which command is built and that each
rank sees only its core; none of it has been run on a trn2. Notebook 05 uses this module.

Names that moved keep working from here: the core lists' functions (:mod:`trnlab.rank_cores`),
:func:`validate_parallel_sizes` and :class:`LaunchConfigError` (:mod:`trnlab.mesh`),
:class:`LaunchResult`, :class:`LaunchError` and :func:`free_port` (:mod:`trnlab.runner`).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import uuid
from dataclasses import dataclass, field

from trnlab.deprecation import moved_names, warn_deprecated
from trnlab.device import backend_available, detect_backend, device_count
from trnlab.instances import PlanError, get_instance
from trnlab.mesh import LaunchConfigError, checked_config, mesh_sizes as _mesh_sizes, validate_parallel_sizes
from trnlab.rank_cores import (VISIBLE_CORES_VAR, CoreListError, format_core_list,  # noqa: F401  (re-exported)
                               needs_rank_cores, parse_core_list, parse_neuron_cores, rank_neuron_cores,
                               visible_cores_setting, visible_neuron_cores)
from trnlab.runner import (LAUNCH_ID_VAR, RANK_PREFIX_TEMPLATE, LaunchError, LaunchResult,  # noqa: F401
                           check_timeouts, core_holders_notice, free_port, run_commands)
from trnlab.settings import DEFAULT_INSTANCE

__all__ = ["DIST_BACKENDS", "CPU_DEFAULT_PROCESSES", "neuron_cores_per_node", "ProcessPlan",
           "plan_processes", "torchrun_command", "multinode_commands", "slurm_script", "launch_command",
           "launch", "launch_loopback_nodes"]

#: torch.distributed backend for each device type (Transformers' ``DISTRIBUTED_BACKEND_MAP`` agrees).
DIST_BACKENDS = {"neuron": "neuron", "cuda": "nccl", "cpu": "gloo"}

#: Processes on CPU when nothing asks for more: enough to show a mesh, few enough for a laptop.
CPU_DEFAULT_PROCESSES = 2


def neuron_cores_per_node(instance: str) -> int:
    """Logical NeuronCores (one process each) on one node of ``instance``, e.g. 64 on trn2.48xlarge.

    Read from the instance table (:data:`trnlab.instances.INSTANCES`, figures from the Neuron
    docs, one source for the planner and the launcher): a Trainium2 chip has 8 physical
    NeuronCores, 4 logical ones at the default ``NEURON_LOGICAL_NC_CONFIG=2``; a trn2.3xlarge
    has 1 chip, a trn2.48xlarge 16. trn1 is refused: it has no native ``neuron`` device.
    """
    try:
        return get_instance(instance).cores_per_host
    except PlanError as exc:
        raise LaunchConfigError(str(exc)) from None


def model_config_of(model=None):
    """Deprecated: write :func:`trnlab.models.load_config` (``trnlab.load_config``) instead.

    The Transformers config of ``model`` (a config object, a name or folder, or ``None`` for the
    course's model), as :func:`validate_parallel_sizes` checks a mesh against it; a model with
    no config to be found raises :class:`LaunchConfigError` saying where it looked.
    """
    warn_deprecated("launcher.model_config_of", "`trnlab.load_config(model)` (trnlab.models.load_config)")
    return checked_config(model)


# ---------------------------------------------------------------------------------------------
# How many processes, which backend
# ---------------------------------------------------------------------------------------------

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


def _device_type(device) -> str | None:
    """``"cuda"`` from ``torch.device("cuda:0")``, ``"cuda:1"`` or ``"cuda"``; ``None`` for ``None``/``"auto"``."""
    if device is None:
        return None
    text = (getattr(device, "type", None) or str(device)).split(":")[0].strip().lower()
    return None if text in ("", "auto") else text


def _cpu_plan(nproc: int | None, note: str = "") -> ProcessPlan:
    """gloo CPU processes sharing this machine's cores; accelerators here are hidden from the ranks."""
    cpus = os.cpu_count() or 1
    chosen = nproc or CPU_DEFAULT_PROCESSES
    threads = max(1, cpus // chosen)
    env = {"OMP_NUM_THREADS": str(threads)}
    hidden = []
    if backend_available("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = ""           # Transformers would otherwise bind each rank to a GPU
        hidden.append("CUDA_VISIBLE_DEVICES=''")
    if backend_available("neuron"):
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch would otherwise autoload TorchNeuron in each rank
        hidden.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    reason = note or "no accelerator, so "
    reason += (f"{chosen} CPU processes talk over gloo with OMP_NUM_THREADS={threads} each "
               f"({cpus} core(s) here)")
    if hidden:
        reason += f"; the ranks get {' and '.join(hidden)}, so they stay on the CPU"
    if chosen > cpus:
        reason += "; more processes than cores, fine for a tiny model, slow for a real one"
    return ProcessPlan("cpu", "gloo", chosen, cpus, reason, env)


def plan_processes(nproc: int | None = None, device=None) -> ProcessPlan:
    """Choose the process count and torch.distributed backend for this machine.

    * Trainium: one process per visible NeuronCore (``NEURON_RT_VISIBLE_CORES`` when set,
      else ``torch.neuron.device_count()``), backend ``neuron``.
    * GPUs: one process per GPU, backend ``nccl``. With fewer GPUs than ``nproc`` it falls back
      to gloo CPU processes, and the plan's reason says so and why.
    * CPU: ``gloo`` with :data:`CPU_DEFAULT_PROCESSES` processes, each with
      ``OMP_NUM_THREADS`` = its share of the cores so they do not fight over them.

    ``nproc`` asks for a number (e.g. ``tp_size * fsdp_size``). ``device`` is the device the
    caller chose (``"cpu"``, ``"cuda"``, ``"neuron"``, a ``torch.device`` such as the one
    :func:`trnlab.setup` returns; ``None`` or ``"auto"``: detect). ``device="cpu"`` gives CPU
    processes even where an accelerator exists. On Trainium two processes cannot share one
    NeuronCore, so more ranks than visible cores is an error that names the fix.
    Used by :func:`launch` and notebook 05.
    """
    device = _device_type(device) or detect_backend()
    if device not in DIST_BACKENDS:
        raise LaunchConfigError(f"unknown device {device!r}: use one of {', '.join(DIST_BACKENDS)}")
    if nproc is not None and nproc < 1:
        raise LaunchConfigError(f"nproc={nproc}: launch at least one process")
    if device == "cpu":
        return _cpu_plan(nproc, "" if detect_backend() == "cpu" else "device cpu was asked for, so ")

    if not backend_available(device):
        raise LaunchConfigError(f"device={device!r} was requested but this machine has none: "
                                f"leave device=None to use what is here")
    if device == "neuron":
        from_env = visible_neuron_cores()
        visible = from_env if from_env is not None else device_count("neuron")
        source = (f"{VISIBLE_CORES_VAR}={visible_cores_setting()}" if from_env is not None
                  else "torch.neuron.device_count()")
        what = "NeuronCore"
    else:
        visible, source, what = device_count("cuda"), "torch.cuda.device_count()", "GPU"
    chosen = nproc or visible
    if chosen > visible and device == "cuda":
        return _cpu_plan(chosen, f"fell back to CPU: {chosen} ranks need {chosen} GPUs, one each, but {source} "
                                 f"gives {visible}, so ")
    if chosen > visible:
        hint = "widen NEURON_RT_VISIBLE_CORES, " if from_env is not None else ""
        raise LaunchConfigError(
            f"{chosen} processes need {chosen} {what}s but {source} gives {visible}: {hint}"
            f"lower tp_size * fsdp_size to at most {visible}, add nodes (nnodes), or pass device='cpu' "
            f"for gloo CPU processes.")
    reason = f"one process per {what}, {visible} visible ({source})"
    if chosen < visible:
        reason += f"; {visible - chosen} left idle because the mesh needs {chosen}"
    return ProcessPlan(device, DIST_BACKENDS[device], chosen, visible, reason)


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


def _node_processes(instance: str, nproc_per_node: int | None, neuron_cores) -> tuple[int, list[int] | None]:
    """Processes per node of ``instance`` and their cores (``None``: all), refused where a node has too few."""
    cores_per_node = neuron_cores_per_node(instance)  # refuses trn1 and unknown instances
    cores = None
    if neuron_cores is not None:
        cores = (parse_neuron_cores(neuron_cores, "neuron_cores") if isinstance(neuron_cores, str)
                 else rank_neuron_cores(len(list(neuron_cores)), list(neuron_cores)))
        if not cores:
            raise LaunchConfigError(f"neuron_cores={neuron_cores!r} names no core: list the cores each node's ranks "
                                    "use (e.g. [0, 1] or '0-1'), or leave neuron_cores out for all of a node's cores")
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
    return nproc_per_node, cores


def slurm_script(script, script_args=(), *, nnodes: int, instance: str = DEFAULT_INSTANCE,
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
    nproc_per_node, cores = _node_processes(instance, nproc_per_node, neuron_cores)
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
set -euo pipefail
{activate}export HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --ntasks-per-node=1 bash -c {per_node} {worker}
"""


# ---------------------------------------------------------------------------------------------
# Launching: these commands, handed to trnlab.runner
# ---------------------------------------------------------------------------------------------

def launch_command(script, script_args=(), *, nproc_per_node: int | None = None, device=None,
                   tp_size: int | None = None, fsdp_size: int | None = None, model=None,
                   env: dict[str, str] | None = None, module: bool = False, neuron_cores=None,
                   python: str | None = None, tee: bool = True) -> tuple[list[str], dict[str, str], ProcessPlan]:
    """The checked ``(cmd, env, plan)`` of a torchrun launch on this machine; nothing is started.

    As :func:`launch` takes them: the process count and backend from :func:`plan_processes`
    (``nproc_per_node`` defaults to ``tp_size * fsdp_size``, else one per core of
    ``neuron_cores``); with ``tp_size``/``fsdp_size`` the mesh is checked against the processes
    and the model (:func:`validate_parallel_sizes`). ``env`` is the plan's worker environment
    plus the one given. ``python``/``tee`` as in :func:`torchrun_command` (``python="torchrun",
    tee=False`` writes the command a user would type, as ``--dry-run`` prints it).
    Raises :class:`LaunchConfigError` for anything that does not fit.
    """
    sizes = _mesh_sizes(tp_size, fsdp_size)
    plan = plan_processes(_default_nproc(nproc_per_node, sizes, neuron_cores), device)
    if sizes is not None:
        validate_parallel_sizes(plan.nproc_per_node, *sizes, model_config=model)
    cmd = torchrun_command(script, script_args, nproc_per_node=plan.nproc_per_node, module=module,
                           python=python, tee=tee, neuron_cores=_planned_rank_cores(plan, neuron_cores))
    return cmd, {**plan.env, **(env or {})}, plan


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
    check_timeouts(timeout, grace)
    cmd, child_env, plan = launch_command(script, script_args, nproc_per_node=nproc_per_node, device=device,
                                          tp_size=tp_size, fsdp_size=fsdp_size, model=model, env=env,
                                          module=module, neuron_cores=neuron_cores)
    if echo:
        print(f"$ {shlex.join(cmd)}\n  ({plan})", flush=True)
        notice = core_holders_notice() if plan.device == "neuron" else None
        if notice:
            print(notice, flush=True)
    result = run_commands([cmd], child_env, timeout, grace, echo)
    if check and not result.ok:
        raise LaunchError(result.describe() + (f"\n{result.traceback}" if result.traceback else ""), result)
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
    check_timeouts(timeout, grace)
    endpoint = f"127.0.0.1:{free_port()}"
    commands = multinode_commands(script, script_args, nnodes=nnodes, nproc_per_node=nproc_per_node,
                                  rdzv_endpoint=endpoint, rdzv_backend=rdzv_backend,
                                  rdzv_id=f"loopback-{uuid.uuid4().hex[:8]}", module=module,
                                  python=None, tee=True)
    plan = plan_processes(nnodes * nproc_per_node, "cpu")
    if echo:
        for node, cmd in enumerate(commands):
            print(f"$ {shlex.join(cmd)}    # node {node}", flush=True)
    return run_commands(commands, {**plan.env, **(env or {})}, timeout, grace, echo)


#: ``trnlab.launcher.main`` was the ``launch`` command's entry point: it is :mod:`trnlab.cli.launch` now.
__getattr__ = moved_names("trnlab.launcher", {
    "main": ("trnlab.cli.launch", "`python -m trnlab launch ...` or `trnlab.cli.launch.main(argv)`")})
