"""Every collective on the STAND-IN `neuron` process group against gloo on CPU, same inputs, in one torchrun job.

    TRNLAB_NEURON_STANDIN=1 torchrun --nproc-per-node=4 neuron_collectives.py OUT.json

Each rank runs each collective twice: on neuron tensors through the default `neuron` group, and on CPU copies
through a gloo group of the same ranks; rank 0 writes, per collective, whether every rank's results were equal.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from trnlab.distributed import finish

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
device = torch.device("neuron")  # no index: this rank's one core
results, errors = {}, {}


def data(*shape, dtype=torch.float32, salt=0):
    """Inputs that differ per rank and per call, the same on both sides."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(1, 100, shape, generator=g, dtype=dtype)


def check(name, run):
    """``run(to, group)`` returns tensors; equal on neuron (default group) and on CPU (gloo group)?"""
    try:
        on_neuron = [t.cpu() for t in run(lambda t: t.to(device), None)]
        on_cpu = run(lambda t: t.clone(), gloo)
        assert all(t.device.type == "cpu" for t in on_cpu)
        results[name] = len(on_neuron) == len(on_cpu) and all(torch.equal(a, b) for a, b in zip(on_neuron, on_cpu))
    except Exception as error:  # noqa: BLE001  (recorded: the test names it)
        errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"


ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
       "bxor": dist.ReduceOp.BXOR, "premul_sum": dist._make_nccl_premul_sum(2.0)}
for op_name, op in ops.items():
    dtype = torch.int64 if op_name in ("band", "bor", "bxor") else torch.float32

    def all_reduce(to, group, op=op, dtype=dtype):
        t = to(data(5, 3, dtype=dtype, salt=1))
        if group is gloo and op_name == "premul_sum":  # gloo has no PREMUL_SUM: its meaning, scale then sum
            t, op = t.mul_(2.0), dist.ReduceOp.SUM
        dist.all_reduce(t, op=op, group=group)
        return [t]
    check(f"all_reduce {op_name}", all_reduce)


def async_all_reduce(to, group):  # what DDP's hook does: the future's value is the reduced tensor, on its device
    t = to(data(7, salt=2))
    (value,) = dist.all_reduce(t, async_op=True, group=group).get_future().wait()
    assert value.device == t.device and value.data_ptr() == t.data_ptr()
    return [value]


def broadcast(to, group):
    t = to(data(4, 4, salt=3))
    dist.broadcast(t, src=2 % world, group=group)
    return [t]


def all_gather(to, group):
    out = [to(torch.zeros(3, 2)) for _ in range(world)]
    dist.all_gather(out, to(data(3, 2, salt=4)), group=group)
    return out


def all_gather_into_tensor(to, group):
    out = to(torch.zeros(world * 6))
    dist.all_gather_into_tensor(out, to(data(6, salt=5)), group=group)
    return [out]


def reduce_scatter(to, group):
    out = to(torch.zeros(4))
    dist.reduce_scatter(out, [to(data(4, salt=6 + i)) for i in range(world)], group=group)
    return [out]


def reduce_scatter_tensor(to, group):
    out = to(torch.zeros(3))
    dist.reduce_scatter_tensor(out, to(data(world * 3, salt=7)), group=group)
    return [out]


def reduce_scatter_tensor_premul_sum(to, group):  # FSDP2's with a gradient divide factor
    out, given = to(torch.zeros(3)), to(data(world * 3, salt=15))
    if group is gloo:
        dist.reduce_scatter_tensor(out, given * 0.25, group=group)
    else:
        dist.reduce_scatter_tensor(out, given, op=dist._make_nccl_premul_sum(0.25), group=group)
        assert torch.equal(given.cpu(), to(data(world * 3, salt=15)).cpu())  # the input is left as it was
    return [out]


def all_to_all(to, group):
    out = [to(torch.zeros(2)) for _ in range(world)]
    dist.all_to_all(out, [to(data(2, salt=8 + i)) for i in range(world)], group=group)
    return out


def all_to_all_single(to, group):
    out = to(torch.zeros(world * 2))
    dist.all_to_all_single(out, to(data(world * 2, salt=9)), group=group)
    return [out]


def reduce(to, group):
    t = to(data(6, salt=10))
    dist.reduce(t, dst=1 % world, group=group)
    return [t] if rank == 1 % world else []


def gather(to, group):
    out = [to(torch.zeros(2, 2)) for _ in range(world)] if rank == 0 else None
    dist.gather(to(data(2, 2, salt=11)), out, dst=0, group=group)
    return out or []


def scatter(to, group):
    out = to(torch.zeros(5))
    dist.scatter(out, [to(data(5, salt=12 + i)) for i in range(world)] if rank == 0 else None, src=0, group=group)
    return [out]


def send_recv(to, group):
    right, left = (rank + 1) % world, (rank - 1) % world
    got = to(torch.zeros(3))
    if rank % 2 == 0:
        dist.send(to(data(3, salt=13)), dst=right, group=group)
        dist.recv(got, src=left, group=group)
    else:
        dist.recv(got, src=left, group=group)
        dist.send(to(data(3, salt=13)), dst=right, group=group)
    return [got]


def bfloat16_all_reduce(to, group):
    t = to(data(8, dtype=torch.bfloat16, salt=14))
    dist.all_reduce(t, group=group)
    return [t]


def barrier(to, group):
    dist.barrier(group=group)
    return []


def objects(to, group):
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "word": "abc"[: rank + 1]}, group=group)
    sent = [{"from": 0, "list": [1, 2]}] if rank == 0 else [None]
    dist.broadcast_object_list(sent, src=0, group=group)
    return [torch.tensor([o["rank"] for o in gathered]), torch.tensor(sent[0]["list"])]


for fn in (async_all_reduce, broadcast, all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor,
           reduce_scatter_tensor_premul_sum,
           all_to_all, all_to_all_single, reduce, gather, scatter, send_recv, bfloat16_all_reduce, barrier, objects):
    check(fn.__name__, fn)

# Bad input: a CPU tensor in a neuron collective, and another rank's device.
refusals = {}
try:
    dist.all_gather([torch.zeros(2, device=device) for _ in range(world)], torch.zeros(2))
except Exception as error:  # noqa: BLE001
    refusals["cpu_tensor"] = str(error).splitlines()[0]
try:
    torch.zeros(1, device=f"neuron:{(rank + 1) % world}")
except Exception as error:  # noqa: BLE001
    refusals["other_core"] = str(error).splitlines()[0]

# The device a rank sees, generators on it, and the streams FSDP2 uses.
g = torch.Generator(device="neuron").manual_seed(7)
drawn = torch.randint(0, 10, (6,), device="neuron", generator=g)
stream, event = torch.neuron.Stream(), torch.neuron.Event()
with torch.neuron.stream(stream):
    event.record()
torch.neuron.current_stream().wait_stream(stream)
event.wait()
seen = {"rank": rank, "current_device": torch.neuron.current_device(), "device_count": torch.neuron.device_count(),
        "default_device": str(torch.empty(1, device=device).device), "visible": os.environ["NEURON_RT_VISIBLE_CORES"],
        "generator": str(g.device), "drawn_like_cpu": torch.equal(drawn.cpu(), torch.randint(
            0, 10, (6,), generator=torch.Generator().manual_seed(7))),
        "stream_device": str(stream.device), "event_done": event.query(), "refusals": refusals}
everyone = [None] * world
dist.all_gather_object(everyone, seen)
agreed = [None] * world
dist.all_gather_object(agreed, (results, errors))
if rank == 0:
    names = list(results) + list(errors)
    summary = {name: {"equal": all(r.get(name, False) for r, _ in agreed),
                      "errors": sorted({e[name] for _, e in agreed if name in e})} for name in names}
    with open(sys.argv[1], "w") as f:
        json.dump({"collectives": summary, "ranks": everyone}, f, indent=1)
finish()  # trnlab's: closes the process groups and ends the rank before interpreter teardown
