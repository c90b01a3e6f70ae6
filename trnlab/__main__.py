"""``python -m trnlab COMMAND``: the course's command line (doctor, bench, launch, plan); argument parsing only.
The optional parts (planner, benches, doctor) are imported only when their command runs."""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys

from trnlab.launcher import INSTANCES, RESTART_ENV, _launch_command, launch
from trnlab.models import SHIPPED_MODELS
from trnlab.settings import _DEFAULT_INSTANCE, SettingError, whole_number


def _timeout_arg(text: str) -> float | None:
    try:
        return None if text.strip().lower() == "none" else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (or 'none')") from None


def _launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trnlab launch",
        description="Launch SCRIPT with torchrun on this machine, or print its command (--dry-run).")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    parser.add_argument("--nproc-per-node", type=int,
                        help="processes per node (default: one per NeuronCore/GPU, or tp*fsdp, or 2 on CPU)")
    parser.add_argument("--tp-size", type=int)
    parser.add_argument("--fsdp-size", type=int)
    parser.add_argument("--model", help="model whose config is checked (default: TRNLAB_MODEL or the course model)")
    parser.add_argument("--neuron-cores",
                        help="run on these NeuronCores only, one per rank, e.g. 4-7. Default on Trainium: all cores "
                             "(TorchNeuron gives rank i core i), or this shell's NEURON_RT_VISIBLE_CORES when set")
    parser.add_argument("--timeout", type=_timeout_arg, default=3600.0,
                        help="seconds before the run is stopped (default 3600; 'none': no limit)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="times torchrun restarts every rank after one fails (default 0); the script resumes")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    return parser


def _launch(argv: list[str] | None = None) -> int:
    """``python -m trnlab launch [options] SCRIPT [ARGS...]``: run, or print, a torchrun launch.
    Every bad value is refused, with the fix, before anything runs (exit status 2)."""
    args = _launch_parser().parse_args(argv)
    try:
        if args.nproc_per_node is not None:
            whole_number("--nproc-per-node", args.nproc_per_node)
        if args.dry_run:
            cmd, plan = _launch_command(args.script, args.script_args, nproc_per_node=args.nproc_per_node,
                                        tp_size=args.tp_size, fsdp_size=args.fsdp_size, model=args.model,
                                        neuron_cores=args.neuron_cores, python="torchrun", tee=False,
                                        max_restarts=args.max_restarts)
            prefix = [f"{k}={v}" for k, v in RESTART_ENV.items()] if args.max_restarts else []
            print(f"{shlex.join([*prefix, *cmd])}\n# {plan}")  # bytes per rank: python -m trnlab plan --tp ... --train
            return 0
        return launch(args.script, args.script_args, nproc_per_node=args.nproc_per_node, tp_size=args.tp_size,
                      fsdp_size=args.fsdp_size, model=args.model, timeout=args.timeout,
                      neuron_cores=args.neuron_cores, max_restarts=args.max_restarts).returncode
    except SettingError as exc:  # PlanError included
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _plan(argv: list[str] | None = None) -> int:
    """``python -m trnlab plan ...``: print the mesh plan (text or ``--json``); 2 after printing the error."""
    planning = importlib.import_module("trnlab.planning")
    p = argparse.ArgumentParser(
        prog="python -m trnlab plan",
        description="Bytes per NeuronCore and the right (tp, fsdp) mesh for a model on a Trainium instance. "
                    f"Offline for the shipped configs: {', '.join(SHIPPED_MODELS)}.")
    p.add_argument("--model", help="shipped name, local folder (holding config.json) or hub name (default: $TRNLAB_MODEL "
                                   "or the course's tiny model)")
    p.add_argument("--instance", default=_DEFAULT_INSTANCE, help=f"one of {', '.join(INSTANCES)}")
    p.add_argument("--train", action="store_true", help="plan training (default: inference)")
    p.add_argument("--batch", type=int, default=1, help="sequences per data-parallel (FSDP) rank")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: 2048, at most the model's "
                                           "max_position_embeddings)")
    p.add_argument("--tp", type=int, help="plan only this tensor-parallel size")
    p.add_argument("--fsdp", type=int, help="plan only this FSDP size")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--headroom", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (default bfloat16)")
    p.add_argument("--master-weights", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--checkpointing", default="auto", choices=["auto", *planning.CHECKPOINTING],
                   help="activation checkpointing for --train: auto (default: the least recompute that fits), none, "
                        "selective (every --checkpoint-every-th layer, TorchTitan's layer-level selective AC) or full")
    p.add_argument("--checkpoint-every", type=int, default=2, help="selective: checkpoint every k-th layer (default 2)")
    p.add_argument("--cache-length", type=int, help="static KV cache positions (default: --seq)")
    p.add_argument("--shards", action="store_true", help="list every tensor's shard on one rank")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    try:
        plan = planning.plan_mesh(args.model, args.instance, "train" if args.train else "inference", batch=args.batch,
                                  seq=args.seq, headroom=args.headroom, nodes=args.nodes, tp_size=args.tp,
                                  fsdp_size=args.fsdp, dtype=args.dtype, master_weights=args.master_weights,
                                  gradient_checkpointing=None if args.checkpointing == "auto" else args.checkpointing,
                                  cache_length=args.cache_length, checkpoint_every=args.checkpoint_every)
    except SettingError as exc:  # PlanError included
        if args.json:
            print(json.dumps({"error": str(exc)}, indent=1))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = plan.summary()
        if args.shards:
            out["recommended"]["plan"] = plan.recommended.plan.summary(shards=True)
        print(json.dumps(out, indent=1))
    else:
        print(planning.format_plan(plan, shards=args.shards))
    return 0


#: command words -> its function (remaining argv -> exit code), or "module:function", imported only when it runs.
_COMMANDS = {
    ("doctor",): "trnlab.doctor:main",
    ("bench", "generate"): "trnlab.bench:main_generate",
    ("bench", "train"): "trnlab.bench:main_train",
    ("launch",): _launch,
    ("plan",): _plan,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words, command in sorted(_COMMANDS.items(), key=lambda item: -len(item[0])):
        if tuple(argv[: len(words)]) == words:
            if isinstance(command, str):
                module, function = command.split(":")
                command = getattr(importlib.import_module(module), function)
            return command(argv[len(words):])
    usage = "\n".join(f"  python -m trnlab {' '.join(words)}" for words in _COMMANDS)
    print(f"usage: one of\n{usage}\n(add --help after a command for its options)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
