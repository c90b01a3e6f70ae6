"""Two ranks spawned by torch.multiprocessing, as Transformers' distributed test mixins start them: each child sets
its own RANK, LOCAL_RANK and WORLD_SIZE after importing torch, then creates the neuron process group (tests only).

    python tests/scripts/spawned_ranks.py OUT.json [inherit]

``inherit``: the parent sets NEURON_RT_VISIBLE_CORES=0 first, and every child inherits it."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trnlab.distributed import finish


def rank_main(rank, port, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        dist.init_process_group("neuron", rank=rank, world_size=2)
        total = torch.full((2,), float(rank + 1), device="neuron")
        dist.all_reduce(total)
        seen = {"current_device": torch.neuron.current_device(), "visible": os.environ["NEURON_RT_VISIBLE_CORES"],
                "device": str(total.device), "sum": total.tolist()}
    except Exception as error:  # noqa: BLE001 (reported to the parent)
        seen = {"error": str(error)}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    finish()


if __name__ == "__main__":
    out = sys.argv[1]
    if sys.argv[2:] == ["inherit"]:
        os.environ["NEURON_RT_VISIBLE_CORES"] = "0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, out), nprocs=2)
    json.dump([json.load(open(f"{out}.{rank}")) for rank in range(2)], open(out, "w"))
