"""Mistakes on the STAND-IN `neuron` process group, one per run: each must end with a clear error, never hang.

    TRNLAB_NEURON_STANDIN=1 torchrun --nproc-per-node=2 neuron_misuse.py CASE

CASE: early-tensor (a tensor on neuron before init_process_group), or dies (rank 1 exits while rank 0 waits in an
all_reduce). NEURON_RT_VISIBLE_CORES set by the caller gives the core-sharing cases.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist

from trnlab.distributed import finish

case = sys.argv[1]
if case == "early-tensor":
    torch.ones(2, device="neuron")  # starts the runtime too early, as TorchNeuron sees it
dist.init_process_group("neuron")
print(f"rank {dist.get_rank()} up", flush=True)
t = torch.ones(2, device="neuron")
if case == "dies" and dist.get_rank() == 1:
    dist.barrier()
    os._exit(3)  # gone without a word, as a crashed process
if case == "dies":
    # torchrun SIGTERMs the ranks left once it sees rank 1 gone; this one then still says what it saw (and exits by
    # itself), so that the report always has a peer's traceback: without it, which comes first is chance.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.barrier()
    dist.all_reduce(t)  # rank 1 never comes: torchrun must stop this rank
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.tolist()}", flush=True)
finish()  # trnlab's: closes the process groups and ends the rank before interpreter teardown
