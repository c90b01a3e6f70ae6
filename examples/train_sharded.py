"""Train a model sharded over a TP x FSDP mesh (claim 10) with Trainer; torchrun runs it once per rank.

    torchrun --nproc_per_node=4 examples/train_sharded.py --out run --model MODEL    # notebook 05

Every rank checks the mesh and its batch, loads its shard, reports where its weights live, trains with Trainer on
its slice of each batch, records per step its loss, gradient norm and the update of a few weights (what
trnlab.distributed.compare_runs compares between two runs, rank by rank), and writes run/rank<N>.json; together
they save run/model, one ordinary checkpoint that loads in a single process. examples/train.py is the page's calls
alone; both check the mesh and the rows per rank with trnlab.launcher.check_mesh.
"""
import argparse
import os

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, DistributedConfig, Trainer, TrainingArguments

import trnlab
from trnlab import distributed as td, training
from trnlab.launcher import check_mesh

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--model")  # None: trnlab.model_name reads $TRNLAB_MODEL (or the bundled model)
parser.add_argument("--tp-size", type=int, default=2)
parser.add_argument("--fsdp-size", type=int, default=2)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=8)      # global: each FSDP rank takes 1/fsdp_size
parser.add_argument("--block-length", type=int, default=64)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--skip-model-check", action="store_true")  # only to show what an uneven split does (05)
args = parser.parse_args()
name = trnlab.model_name(args.model)  # --model, else $TRNLAB_MODEL, else the bundled tiny Qwen3
# Checked here, before any rank loads: a mesh the model cannot split, or FSDP ranks left without a row.
mesh = check_mesh(name, args.tp_size, args.fsdp_size, args.batch_size,
                  check_model=not args.skip_model_check)

td.quiet_rank_output()
torch.manual_seed(0)
# 1. Load, sharded at load time: Transformers starts torch.distributed from torchrun's variables
#    (gloo on CPU, neuron on Trainium), builds the (fsdp, tp) mesh, and each rank reads its shard.
model = AutoModelForCausalLM.from_pretrained(
    name,
    dtype=torch.float32,  # fp32 everywhere, so the losses can be compared with one process
    distributed_config=DistributedConfig(tp_size=mesh["tp_size"], fsdp_size=mesh["fsdp_size"]),
)
tokenizer = trnlab.load_tokenizer(name)
rank = dist.get_rank()
report = td.rank_report(model)  # placements and bytes of this rank
print(f"fsdp {report['fsdp']} tp {report['tp']}: {report['local_bytes']:,} of "
      f"{report['full_bytes']:,} parameter bytes")

# 2. The same data pipeline as notebook 04: packed blocks of the fine-tuning texts, one shape.
dataset = training.packed_dataset(tokenizer, training.training_texts(64), args.block_length)
report["loss_before"] = td.batch_loss(model, td.global_batches(dataset, args.batch_size, 1)[0])

# 3. Train with Trainer, which uses the sharded model as is. The batch size is per FSDP rank;
#    the TP ranks of one fsdp coordinate get the same rows.
training_args = TrainingArguments(
    output_dir=args.out,
    max_steps=args.steps,
    per_device_train_batch_size=mesh["rank_batch_size"],
    learning_rate=args.lr,
    lr_scheduler_type="constant", max_grad_norm=0.0, optim="adamw_torch",  # the reference's recipe
    train_sampling_strategy="sequential",  # rows in order, as the one-process reference sees them
    dataloader_drop_last=True,             # every batch the same shape (claim 9)
    use_cpu=model.device.type == "cpu",    # on CPU, Accelerate sees the ranks (MULTI_CPU) only then
    logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
)
refusal = None
try:
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
except ValueError as error:
    # Only on a CPU mesh: Accelerate takes a model sharded at load time on MULTI_NEURON (and
    # MULTI_GPU) but refuses gloo's MULTI_CPU. The shim lets it take the Trainium branch while
    # the Trainer is built, and changes nothing else (notebook 05, "Under the hood").
    if model.device.type != "cpu" or not td.is_parallelism_refusal(error):
        raise
    refusal = str(error).strip()
    with td.cpu_mesh_as_multi_device():
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
report["parity"] = []  # per step: loss, gradient norm, updates of these weights' local shards
trainer.add_callback(td.parity_recorder(["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                         "model.norm.weight"], report["parity"]))
trainer.train()
report["losses"] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
print("trained with Trainer" + (" (CPU mesh: built inside td.cpu_mesh_as_multi_device)" if refusal else ""))

# 4. Generate with the sharded model (all ranks together), then save one checkpoint.
text = td.greedy_text(model, tokenizer, training.NEW_FACT_PROMPT)
td.save_sharded(model, tokenizer, os.path.join(args.out, "model"))
td.write_json(report, os.path.join(args.out, f"rank{rank}.json"))
if rank == 0:
    td.write_json({"refusal": refusal, "generation": text, "args": vars(args)},
                  os.path.join(args.out, "run.json"))
td.finish()  # closes the process groups and ends the rank before interpreter teardown can abort it
