"""Build the ``torchrun`` commands that launch a training script, from one node to a cluster (claim 10).
Pure functions of their arguments and the machine; :func:`launch` runs them through :mod:`trnlab.runner`. Only a run
on a subset of NeuronCores starts each rank through :mod:`trnlab.rank_cores` (see :func:`launch`)."""

from __future__ import annotations

import math
import os
import shlex
import sys
import uuid
from dataclasses import dataclass, field

from trnlab.device import backend_available, detect_backend, device_count, neuron_module
from trnlab.instances import PlanError, get_instance
from trnlab.mesh import LaunchConfigError, mesh_sizes as _mesh_sizes, validate_parallel_sizes
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
    From :data:`trnlab.instances.INSTANCES` (Neuron docs: 4 logical cores per Trainium2 chip at LNC=2); refuses trn1."""
    try:
        return get_instance(instance).cores_per_host
    except PlanError as exc:
        raise LaunchConfigError(str(exc)) from None


# How many processes, which backend

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
    """Choose the process count and torch.distributed backend for this machine, as a :class:`ProcessPlan`.
    One per visible NeuronCore (``neuron``) or GPU (``nccl``), else :data:`CPU_DEFAULT_PROCESSES` on ``gloo``; ``nproc``
    asks for a number, ``device`` for a kind. More ranks than visible NeuronCores raises :class:`LaunchConfigError`."""
    device = _device_type(device) or detect_backend()
    if device not in DIST_BACKENDS:
        raise LaunchConfigError(f"unknown device {device!r}: use one of {', '.join(DIST_BACKENDS)}")
    if nproc is not None and nproc < 1:
        raise LaunchConfigError(f"nproc={nproc}: launch at least one process")
    if device == "cpu":
        return _cpu_plan(nproc, "" if detect_backend() == "cpu" else "device cpu was asked for, so ")
    if device == "neuron" and getattr(neuron_module(), "standin", False):
        return _cpu_plan(nproc, "fell back to CPU: the STAND-IN neuron device has no collectives (no `neuron` "
                                "process group), so ")

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


# Commands

def _script_argv(script, script_args=(), module: bool = False) -> list[str]:
    return (["-m", str(script)] if module else [str(script)]) + [str(a) for a in script_args]


def torchrun_command(script, script_args=(), *, nproc_per_node: int | None = None, nnodes: int = 1,
                     node_rank: int = 0, rdzv_endpoint: str | None = None,
                     rdzv_backend: str = "static", rdzv_id: str = "trnlab", module: bool = False,
                     python: str | None = None, tee: bool = True, neuron_cores=None) -> list[str]:
    """The ``torchrun`` argument list that runs ``script`` on this node (a list: no shell quoting).
    One node without ``rdzv_endpoint`` runs ``--standalone``; ``rdzv_backend`` is ``"static"`` or ``"c10d"``;
    ``python="torchrun"`` writes the console script; ``neuron_cores="4-7"`` gives local rank ``i`` the ``i``-th core."""
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
    With two or more nodes, node 0 hosts the rendezvous at ``rdzv_endpoint`` (``HOST:PORT`` every node can reach);
    ``neuron_cores`` applies on every node. Raises :class:`LaunchConfigError` without an endpoint."""
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
    """A Slurm batch script (``sbatch``) that runs ``script`` on ``nnodes`` Trainium nodes, one torchrun per node.
    ``venv`` is activated on every node; ``neuron_cores`` limits every node to those cores (trnlab installed there).
    Raises :class:`LaunchConfigError` for trn1 or more processes or cores than a node of ``instance`` has."""
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


# Launching: these commands, handed to trnlab.runner

def launch_command(script, script_args=(), *, nproc_per_node: int | None = None, device=None,
                   tp_size: int | None = None, fsdp_size: int | None = None, model=None,
                   env: dict[str, str] | None = None, module: bool = False, neuron_cores=None,
                   python: str | None = None, tee: bool = True) -> tuple[list[str], dict[str, str], ProcessPlan]:
    """The checked ``(cmd, env, plan)`` of a torchrun launch on this machine; nothing is started.
    Takes :func:`launch`'s arguments (``python``/``tee`` as in :func:`torchrun_command`) and checks the mesh with
    :func:`validate_parallel_sizes`; raises :class:`LaunchConfigError` for anything that does not fit."""
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
    """Run ``script`` under ``torchrun`` on this machine, streaming every rank's lines live; a :class:`LaunchResult`.
    Bad input raises :class:`LaunchConfigError` before anything starts, ``check=True`` a failed run :class:`LaunchError`;
    on all NeuronCores TorchNeuron gives each rank its own core (pre-release source snapshot), on a subset trnlab does."""
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
    They get the :func:`multinode_commands` a cluster would and form one gloo job; handling is :func:`launch`'s."""
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

