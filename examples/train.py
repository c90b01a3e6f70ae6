"""The page's distributed training (claim 10), as a learner types it; examples/train_sharded.py is the full script.

    torchrun --nproc_per_node=4 examples/train.py --model MODEL

Each rank checks the mesh and its rows per step, loads its shard with the page's from_pretrained(...,
distributed_config=DistributedConfig(...)), and trains it with Trainer on the packed blocks of notebook 04.
With --save-steps N it writes --out/checkpoint-N every N steps; --resume (or a restart by torchrun or Slurm)
goes on from the newest one, on this mesh or another (tests/test_checkpoints.py runs each case).
"""
import argparse
import os

import torch
from transformers import AutoModelForCausalLM, DistributedConfig, Trainer, TrainingArguments

import trnlab
from trnlab import distributed as td, training
from trnlab.launcher import check_mesh

parser = argparse.ArgumentParser()
parser.add_argument("--model")  # None: $TRNLAB_MODEL, else the course's bundled tiny Qwen3
parser.add_argument("--tp-size", type=int, default=2)
parser.add_argument("--fsdp-size", type=int)  # None: the other ranks, WORLD_SIZE / tp-size
parser.add_argument("--batch-size", type=int, default=8)  # rows a step, all FSDP ranks together
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--out", default="outputs")
parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
parser.add_argument("--save-steps", type=int)  # N: a checkpoint-N every N steps in --out; None: none
parser.add_argument("--resume", action="store_true")  # go on from the newest checkpoint in --out
args = parser.parse_args()
name = trnlab.model_name(args.model)
mesh = check_mesh(name, args.tp_size, args.fsdp_size, args.batch_size)  # before loading: a refusal names its fix
td.quiet_rank_output()  # no progress bars or DTensor notes from every rank

model = AutoModelForCausalLM.from_pretrained(
    name,
    dtype=getattr(torch, args.dtype),
    distributed_config=DistributedConfig(tp_size=mesh["tp_size"], fsdp_size=mesh["fsdp_size"]),
)
tokenizer = trnlab.load_tokenizer(name)
dataset = training.packed_dataset(tokenizer, training.training_texts(), 96)
training_args = TrainingArguments(
    output_dir=args.out,
    bf16=args.dtype == "bfloat16",
    max_steps=args.steps,
    per_device_train_batch_size=mesh["rank_batch_size"],  # the TP ranks of one FSDP rank get the same rows
    dataloader_drop_last=True,  # every batch the same shape: one compiled graph (claim 9)
    use_cpu=model.device.type == "cpu",  # a gloo CPU mesh: without it Accelerate would not see the ranks
    save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps,
    save_only_model=True,  # all Trainer 5.25 saves of a DistributedConfig model; td.sharded_checkpoints saves the rest
    report_to="none", logging_steps=1,
)
with td.cpu_mesh_as_multi_device():  # a gloo CPU mesh only: Accelerate takes a sharded model there too (notebook 05)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
td.sharded_checkpoints(trainer)  # each checkpoint-N: every rank's shards of model and optimizer, scheduler, RNG
# torchrun --max-restarts and a requeued Slurm job run this command again: then it goes on from the newest checkpoint.
restarted = any(os.environ.get(var, "0") != "0" for var in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))
# A restart before the first finished checkpoint starts again from step 0; --resume needs one.
checkpoint = td.latest_checkpoint(args.out, required=args.resume) if args.resume or restarted else None
trainer.train(resume_from_checkpoint=checkpoint)
text = td.greedy_text(model, tokenizer, training.NEW_FACT_PROMPT)  # every rank takes part
if trainer.is_world_process_zero():
    print(f"trained {trainer.state.global_step} steps on a {mesh['tp_size']} x {mesh['fsdp_size']} (tp x fsdp) mesh of "
          f"{model.device.type} ranks, {mesh['rank_batch_size']} row(s) per FSDP rank a step\ngreedy: {text!r}\n",
          end="", flush=True)
print(f"rank {trainer.args.process_index} of {trainer.args.world_size} (node {os.environ['GROUP_RANK']}): "
      f"{model.device}, backend {torch.distributed.get_backend()}, {trainer.accelerator.distributed_type}\n",
      end="", flush=True)  # one write, newline included: ranks sharing one output file cannot run lines together
td.finish()  # closes the process groups and ends the rank before interpreter teardown can abort it
