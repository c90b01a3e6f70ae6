"""``python -m trnlab plan``: parse the options, call :func:`trnlab.planning.plan_mesh`, print the plan."""

from __future__ import annotations

import argparse
import json
import sys

from trnlab.instances import INSTANCES, PlanError
from trnlab.memory_model import CHECKPOINTING
from trnlab.models import SHIPPED_MODELS, text_config
from trnlab.planning import plan_mesh
from trnlab.settings import DEFAULT_INSTANCE
from trnlab.sharding import config_and_label
from trnlab.tables import format_plan

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trnlab plan",
        description="Bytes per NeuronCore and the right (tp, fsdp) mesh for a model on a Trainium instance. "
                    f"Offline for the shipped configs: {', '.join(SHIPPED_MODELS)}.")
    p.add_argument("--model", default=None,
                   help="shipped name, local folder, config.json path or hub name (default: $TRNLAB_MODEL "
                        "or the course's tiny model)")
    p.add_argument("--instance", default=DEFAULT_INSTANCE, help=f"one of {', '.join(INSTANCES)}")
    p.add_argument("--train", action="store_true", help="plan training (default: inference)")
    p.add_argument("--batch", type=int, default=1, help="sequences per data-parallel (FSDP) rank")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: 2048, at most the model's "
                                                         "max_position_embeddings)")
    p.add_argument("--tp", type=int, default=None, help="plan only this tensor-parallel size")
    p.add_argument("--fsdp", type=int, default=None, help="plan only this FSDP size")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--headroom", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (default bfloat16)")
    p.add_argument("--master-weights", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--checkpointing", default="auto", choices=["auto", *CHECKPOINTING],
                   help="activation checkpointing for --train: auto (default: the least recompute that fits), "
                        "none, selective (every --checkpoint-every-th layer, TorchTitan's layer-level selective AC) "
                        "or full")
    p.add_argument("--checkpoint-every", type=int, default=2, help="selective: checkpoint every k-th layer (default 2)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="the same as --checkpointing full")
    p.add_argument("--cache-length", type=int, default=None, help="static KV cache positions (default: --seq)")
    p.add_argument("--shards", action="store_true", help="list every tensor's shard on one rank")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m trnlab plan ...``: print the mesh plan (text or ``--json``).
    Returns 0, or 2 after printing the :class:`PlanError` (to stderr; in the JSON with ``--json``)."""
    args = _parser().parse_args(argv)
    checkpointing = "full" if args.gradient_checkpointing else args.checkpointing
    if args.gradient_checkpointing and args.checkpointing not in ("auto", "full"):
        print(f"error: --gradient-checkpointing means --checkpointing full; it contradicts --checkpointing "
              f"{args.checkpointing}: give one of them", file=sys.stderr)
        return 2
    try:
        config, label = config_and_label(args.model)
        seq = args.seq
        if seq is None:
            seq = min(2048, getattr(text_config(config), "max_position_embeddings", None) or 2048)
        plan = plan_mesh(config, args.instance, "train" if args.train else "inference", batch=args.batch,
                         seq=seq, headroom=args.headroom, nodes=args.nodes, tp_size=args.tp,
                         fsdp_size=args.fsdp, dtype=args.dtype, master_weights=args.master_weights,
                         gradient_checkpointing=None if checkpointing == "auto" else checkpointing,
                         cache_length=args.cache_length, checkpoint_every=args.checkpoint_every)
        plan.model = label
    except PlanError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}, indent=1))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = plan.to_dict()
        if args.shards and plan.recommended is not None:
            out["recommended"]["plan"] = plan.recommended.plan.to_dict(shards=True)
        print(json.dumps(out, indent=1))
    else:
        print(format_plan(plan, shards=args.shards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
