"""Train the course model sharded over a TP x FSDP mesh; run it with torchrun, one process per rank.

    torchrun --nproc-per-node=4 train_sharded.py --out run/    # notebook 05: trnlab.launch(...)

Every rank loads its shard (claim 10), reports where its weights live, trains on its slice
of each batch, and writes run/rank<N>.json; together they save run/model, one ordinary
checkpoint that loads in a single process.
"""
import argparse
import os

import torch
import torch.distributed as dist

import trnlab
from trnlab import data, distributed as td

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--model", default=os.environ.get("TRNLAB_MODEL"))
parser.add_argument("--tp-size", type=int, default=2)
parser.add_argument("--fsdp-size", type=int, default=2)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=8)      # global: each FSDP rank takes half
parser.add_argument("--block-length", type=int, default=64)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

td.quiet_rank_output()
torch.manual_seed(0)
# 1. Load: from_pretrained(distributed_config=DistributedConfig(tp_size, fsdp_size)) shards at load time.
model = td.load_sharded_model(args.model, args.tp_size, args.fsdp_size)
tokenizer = trnlab.load_tokenizer(args.model)
rank = dist.get_rank()
report = td.rank_report(model)  # placements and bytes of this rank
print(f"fsdp {report['fsdp']} tp {report['tp']}: {report['local_bytes']:,} of "
      f"{report['full_bytes']:,} parameter bytes")

# 2. The same data pipeline as notebook 04: packed blocks of the fine-tuning texts.
dataset = data.packed_dataset(tokenizer, data.training_texts(64), args.block_length)
first_batch = td.global_batches(dataset, args.batch_size, 1)[0]
report["loss_before"] = td.batch_loss(model, first_batch)  # whole batch, on every rank

# 3. Train with Trainer, the page's way (on a CPU mesh through trnlab.compat.cpu_mesh_as_multi_device).
run = td.train_sharded(model, dataset, steps=args.steps, batch_size=args.batch_size,
                       learning_rate=args.lr, output_dir=args.out)
report["losses"] = run.losses
print(f"trained with {run.path}")

# 4. Generate with the sharded model (all ranks together), then save one checkpoint.
text = td.greedy_text(model, tokenizer, data.NEW_FACT_PROMPT)
td.save_sharded(model, tokenizer, os.path.join(args.out, "model"))
td.write_json(report, os.path.join(args.out, f"rank{rank}.json"))
if rank == 0:
    td.write_json({"path": run.path, "reason": run.reason, "generation": text,
                   "args": vars(args)}, os.path.join(args.out, "run.json"))
dist.destroy_process_group()
