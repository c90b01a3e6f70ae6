"""Two ranks spawned by torch.multiprocessing, as Transformers' distributed test mixins start them: each child sets
its own RANK, LOCAL_RANK and WORLD_SIZE after importing torch, then creates the neuron process group (tests only).

    python tests/scripts/spawned_ranks.py OUT.json own|inherit|beyond

``inherit``: the parent sets NEURON_RT_VISIBLE_CORES=0 first, and every child inherits it. ``beyond``: each child
says LOCAL_RANK=rank + 4, past the stand-in's 4 NeuronCores."""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trnlab.distributed import finish


def rank_main(rank, port, out, case):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank + 4 * (case == "beyond")), WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
    finish(1 if "error" in seen else 0)  # a failed rank: torch.multiprocessing then stops the other one


if __name__ == "__main__":
    out, case = sys.argv[1:]
    if case == "inherit":
        os.environ["NEURON_RT_VISIBLE_CORES"] = "0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(rank_main, args=(port, out, case), nprocs=2)
    except mp.ProcessExitedException:  # a rank failed and the other was stopped: what each wrote, if it did
        pass
    json.dump([json.load(open(f"{out}.{rank}")) if os.path.exists(f"{out}.{rank}") else {"error": "stopped"}
               for rank in range(2)], open(out, "w"))
