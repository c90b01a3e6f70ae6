"""Give one torchrun rank its own NeuronCore, then run the training script in that process.

    torchrun --nproc-per-node=4 -m trnlab.rank_cores 4,5,6,7 train.py --out run/

The Neuron runtime reserves every NeuronCore a process can see, until that process exits
(Neuron docs, "Neuron Runtime configuration"), and ``NEURON_RT_VISIBLE_CORES`` is read per
process. torchrun gives every rank the same environment, so it cannot hand each rank a
different core by itself; this module runs inside each rank, before the script imports
torch, and sets ``NEURON_RT_VISIBLE_CORES`` to the ``LOCAL_RANK``-th core of the list.
:func:`trnlab.launch` (and ``torchrun_command(neuron_cores=...)``) put it in front of the
script on Trainium. The script runs as ``python SCRIPT ARGS`` (or ``-m MODULE ARGS``) would.
"""
from __future__ import annotations

import os
import runpy
import sys

VISIBLE_CORES_VAR = "NEURON_RT_VISIBLE_CORES"
USAGE = "usage: python -m trnlab.rank_cores CORE,CORE,... (SCRIPT | -m MODULE) [ARGS...]  (one core per local rank)"


def core_for_this_rank(cores: str, local_rank: str | None) -> str:
    """The core of ``cores`` (comma-separated, one per local rank) that rank ``local_rank`` gets."""
    listed = [c for c in cores.split(",") if c]
    if not listed or not all(c.isdigit() for c in listed):
        raise SystemExit(f"trnlab.rank_cores: {cores!r} is not a list of core numbers such as 0,1,2,3\n{USAGE}")
    if local_rank is None or not local_rank.isdigit():
        raise SystemExit("trnlab.rank_cores: LOCAL_RANK is not set: start it with torchrun, one process per "
                         f"core, e.g. torchrun --nproc-per-node={len(listed)} -m trnlab.rank_cores {cores} train.py")
    if int(local_rank) >= len(listed):
        raise SystemExit(f"trnlab.rank_cores: local rank {local_rank} has no core: {cores!r} names "
                         f"{len(listed)}; give one core per process (--nproc-per-node={len(listed)})")
    return listed[int(local_rank)]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        raise SystemExit(USAGE)
    os.environ[VISIBLE_CORES_VAR] = core_for_this_rank(argv[0], os.environ.get("LOCAL_RANK"))
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        script = argv[1]
        sys.argv = [script, *argv[2:]]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
