"""A learner's FSDP2 script, written as the Neuron distributed guide writes one (no trnlab):

    torchrun --nproc-per-node=4 guide_fsdp2.py

fully_shard splits every parameter across the ranks; each rank trains on its quarter of the batch. Each rank
gathers the full weights at the end and checks them against the same steps in one CPU process.
"""
import os

import torch
import torch.distributed as dist
import torch_neuronx  # noqa: F401  Registers the Neuron device and distributed backend.
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend="neuron", init_method="env://", rank=rank, world_size=world_size)
device = torch.device("neuron")
mesh = init_device_mesh("neuron", (world_size,))


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))


def batch(step):
    x = torch.linspace(-1, 1, 8 * 16).reshape(8, 16) + step / 10
    return x, x.sin()


model = make_model().to(device)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x, y = batch(step)
    x, y = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

local = model[0].weight.to_local()
full = [p.full_tensor().detach().cpu() for p in model.parameters()]
reference = make_model()
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in range(4):
    x, y = batch(step)
    loss = torch.nn.functional.mse_loss(reference(x), y)
    reference_optimizer.zero_grad()
    loss.backward()
    reference_optimizer.step()
difference = max((p - q.detach()).abs().max().item() for p, q in zip(full, reference.parameters()))
print(f"rank {rank}: holds {tuple(local.shape)} of {tuple(model[0].weight.shape)} on {local.device}; "
      f"FSDP2 as one process, largest difference {difference:.1e}")
assert difference < 1e-5, difference
dist.destroy_process_group()
