"""``python -m trnlab launch [options] SCRIPT [ARGS...]``: run, or print, a torchrun launch.
Every bad value is refused, with the fix, before anything starts (exit status 2)."""

from __future__ import annotations

import argparse
import shlex
import sys

from trnlab.instances import PlanError
from trnlab.launcher import (launch, launch_command, multinode_commands, neuron_cores_per_node,
                             slurm_script)
from trnlab.memory_model import plan_memory
from trnlab.mesh import LaunchConfigError, mesh_sizes, validate_parallel_sizes
from trnlab.rank_cores import parse_neuron_cores
from trnlab.settings import DEFAULT_INSTANCE, SettingError
from trnlab.tables import format_plan

__all__ = ["build_parser", "run", "main"]


def _timeout_arg(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (or 'none')") from None


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m trnlab launch``."""
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
    parser.add_argument("--instance", default=DEFAULT_INSTANCE,
                        help="Trainium instance of every node, for --slurm (trn2/trn3; see python -m trnlab plan)")
    parser.add_argument("--neuron-cores", default=None,
                        help="run on these NeuronCores only, one per rank, e.g. 4-7 (on every node with "
                             "--nnodes/--slurm). Default on Trainium: all cores (TorchNeuron gives rank i "
                             "core i), or this shell's NEURON_RT_VISIBLE_CORES when set")
    parser.add_argument("--timeout", type=_timeout_arg, default=3600.0,
                        help="seconds before the run is stopped (default 3600; 'none': no limit)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return parser


def _check_counts(args: argparse.Namespace) -> None:
    if isinstance(args.nnodes, int) and args.nnodes < 1:
        raise LaunchConfigError(f"--nnodes {args.nnodes}: give the number of nodes, 1 or more")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise LaunchConfigError(f"--nproc-per-node {args.nproc_per_node}: give 1 or more processes per node")


def _print_slurm(args: argparse.Namespace, sizes) -> int:
    if sizes is not None:
        per_node = args.nproc_per_node or (
            len(parse_neuron_cores(args.neuron_cores, "--neuron-cores")) if args.neuron_cores
            else neuron_cores_per_node(args.instance))
        validate_parallel_sizes(per_node * args.nnodes, *sizes, model_config=args.model)
    print(slurm_script(args.script, args.script_args, nnodes=args.nnodes, instance=args.instance,
                       nproc_per_node=args.nproc_per_node, neuron_cores=args.neuron_cores), end="")
    return 0


def _print_multinode(args: argparse.Namespace, sizes) -> int:
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


def _print_dry_run(args: argparse.Namespace, sizes) -> int:
    cmd, _, plan = launch_command(args.script, args.script_args, nproc_per_node=args.nproc_per_node,
                                  tp_size=args.tp_size, fsdp_size=args.fsdp_size, model=args.model,
                                  neuron_cores=args.neuron_cores, python="torchrun", tee=False)
    print(shlex.join(cmd))
    print(f"# {plan}")
    if sizes is not None:
        memory = plan_memory(args.model, *sizes, workload="train")
        print("# " + format_plan(memory).replace("\n", "\n# "))
    return 0


def run(args: argparse.Namespace) -> int:
    """``main``'s work once the arguments are parsed: every bad value raises before anything runs."""
    _check_counts(args)
    sizes = mesh_sizes(args.tp_size, args.fsdp_size)
    if args.slurm:
        return _print_slurm(args, sizes)
    if args.nnodes > 1:
        return _print_multinode(args, sizes)
    if args.dry_run:
        return _print_dry_run(args, sizes)
    result = launch(args.script, args.script_args, nproc_per_node=args.nproc_per_node,
                    tp_size=args.tp_size, fsdp_size=args.fsdp_size, model=args.model,
                    timeout=args.timeout, neuron_cores=args.neuron_cores)
    return result.returncode if result.returncode is not None else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab launch [options] SCRIPT [ARGS...]``: run, or print, a torchrun launch."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (LaunchConfigError, PlanError, SettingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
