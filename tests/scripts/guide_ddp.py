"""A learner's DDP script, written as the Neuron distributed guide writes one (no trnlab):

    torchrun --nproc-per-node=4 guide_ddp.py

Each rank trains a replica on its quarter of the batch; DDP averages the gradients. Rank 0 checks the result
against the same steps on the whole batch in one CPU process.
"""
import os

import torch
import torch.distributed as dist
import torch_neuronx  # noqa: F401  Registers the Neuron device and distributed backend.
from torch.nn.parallel import DistributedDataParallel

rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend="neuron", init_method="env://", rank=rank, world_size=world_size)
device = torch.device("neuron")


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))


def batch(step):
    x = torch.linspace(-1, 1, 8 * 16).reshape(8, 16) + step / 10
    return x, x.sin()


model = DistributedDataParallel(make_model().to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x, y = batch(step)
    x, y = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

reference = make_model()
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(4):
    x, y = batch(step)
    loss = torch.nn.functional.mse_loss(reference(x), y)
    reference_optimizer.zero_grad()
    loss.backward()
    reference_optimizer.step()
difference = max((p.detach().cpu() - q.detach()).abs().max().item()
                 for p, q in zip(model.module.parameters(), reference.parameters()))
print(f"rank {rank} on {next(model.parameters()).device}: DDP as one process, largest difference {difference:.1e}")
assert difference < 1e-5, difference
dist.destroy_process_group()
