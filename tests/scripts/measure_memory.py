"""Measure the bytes each rank of a sharded model really holds; run with torchrun, one process per rank.

    torchrun --nproc-per-node=4 measure_memory.py --model MODEL --out run/ --tp-size 2 --fsdp-size 2

Every rank loads its shard (``DistributedConfig(tp_size, fsdp_size)``, fp32), counts the bytes of
its local parameter shards, trains one step (forward, backward, one AdamW step) on a random
micro-batch of its own, then counts parameters, gradients and optimizer state again, and writes
run/rank<N>.json. ``tests/test_distributed.py`` compares the numbers with
:func:`trnlab.plan_memory` (notebook 06 names that check).
"""
import argparse
import os

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, DistributedConfig

import trnlab
from trnlab import distributed as td

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--model")  # None: trnlab.model_name reads $TRNLAB_MODEL (or the bundled model)
parser.add_argument("--tp-size", type=int, default=2)
parser.add_argument("--fsdp-size", type=int, default=2)
parser.add_argument("--batch", type=int, default=2)      # sequences per FSDP rank
parser.add_argument("--seq", type=int, default=32)
args = parser.parse_args()


def local_bytes(tensor) -> int:
    """Bytes of this rank's piece: a DTensor's local shard, or the tensor itself."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


td.quiet_rank_output()
# The page's call (claim 10): sharded at load time over the (fsdp, tp) mesh, fp32 as the plan assumes.
model = AutoModelForCausalLM.from_pretrained(
    trnlab.model_name(args.model),   # --model, else $TRNLAB_MODEL, else the bundled tiny Qwen3
    dtype=torch.float32,
    distributed_config=DistributedConfig(tp_size=args.tp_size, fsdp_size=args.fsdp_size),
).train()
position = td._mesh_position(model)
params = list(model.parameters())          # tied weights once
loaded = sum(local_bytes(p) for p in params)

# One training step on this FSDP rank's own micro-batch (TP partners share it: same seed).
generator = torch.Generator().manual_seed(1000 + position["fsdp"])
ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=generator)
optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
optimizer.step()

report = {
    **position,
    "parameter_tensors": len(params),
    "parameter_bytes_loaded": loaded,
    "parameter_bytes": sum(local_bytes(p) for p in params),
    "gradient_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
    "optimizer_bytes": sum(local_bytes(v) for state in optimizer.state.values()
                           for v in state.values() if torch.is_tensor(v)),
    "loss": loss.item(),
}
report["training_state_bytes"] = report["parameter_bytes"] + report["gradient_bytes"] + report["optimizer_bytes"]
print(f"fsdp {position['fsdp']} tp {position['tp']}: parameters {report['parameter_bytes']:,} B, "
      f"gradients {report['gradient_bytes']:,} B, AdamW state {report['optimizer_bytes']:,} B")
td.write_json(report, os.path.join(args.out, f"rank{dist.get_rank()}.json"))
td.finish()
