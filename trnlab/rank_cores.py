"""Give one torchrun rank its own NeuronCore of a subset, then run the training script in that process.

    torchrun --nproc-per-node=4 -m trnlab.rank_cores 4-7 train.py --out run/

When ``NEURON_RT_VISIBLE_CORES`` is unset, TorchNeuron's ``neuron`` process group gives each
rank core ``LOCAL_RANK`` by itself (it sets the variable to ``LOCAL_RANK`` if unset, per the
source snapshot in the course's trainium-facts), so plain torchrun on all cores needs nothing.
A run on a *subset* of cores does: torchrun gives every rank the same environment, and a shared
``NEURON_RT_VISIBLE_CORES=4-7`` would give every rank four cores. This module runs inside each
rank, before the script imports torch, and sets ``NEURON_RT_VISIBLE_CORES`` to the
``LOCAL_RANK``-th core of the list. :func:`trnlab.launch` and
``torchrun_command(neuron_cores=...)`` put it in front of the script only in that case. The
script runs as ``python SCRIPT ARGS`` (or ``-m MODULE ARGS``) would. Verified on CPU (each
rank sees only its core); nothing of this has been run on a trn2.

The core-list grammar (:func:`parse_core_list`) is the Neuron runtime's, shared with
``--neuron-cores`` and ``NEURON_RT_VISIBLE_CORES``. This module imports no torch on purpose.
"""
from __future__ import annotations

import os
import runpy
import sys

VISIBLE_CORES_VAR = "NEURON_RT_VISIBLE_CORES"
USAGE = ("usage: python -m trnlab.rank_cores CORES (SCRIPT | -m MODULE) [ARGS...]  "
         "(CORES like 4-7 or 0,2,5: one core per local rank)")


class CoreListError(ValueError):
    """A core list that is not one: the message shows the forms that work."""


def parse_core_list(value, name: str = VISIBLE_CORES_VAR) -> list[int]:
    """The NeuronCore numbers a core list names, in order: ``"0-3"`` -> ``[0, 1, 2, 3]``.

    The forms are the Neuron runtime's: a single core (``"3"``), a range (``"0-3"``) or a list
    of both (``"0,1,4-5"``). A core named twice is refused, since two ranks (or a rank and a
    notebook kernel) must never share one. Raises :class:`CoreListError` naming ``name``.
    """
    cores: list[int] = []
    text = str(value).replace(" ", "")
    for part in text.split(","):
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or int(last or first) < int(first):
            raise CoreListError(f"{name}={value!r} is not a core list: use e.g. '0-3' or '0,1,2,3' "
                                "(core numbers >= 0, ranges low-high)")
        for core in range(int(first), int(last or first) + 1):
            if core in cores:
                raise CoreListError(f"{name}={value!r} names core {core} twice: each rank needs its own "
                                    "core, so list every core once (e.g. '0-3')")
            cores.append(core)
    return cores


def format_core_list(cores) -> str:
    """A core list in the runtime's short form, runs as ranges: ``[4, 5, 6, 7, 9]`` -> ``"4-7,9"``."""
    parts: list[str] = []
    cores = [int(c) for c in cores]
    i = 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if j == i else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)


def core_for_this_rank(cores: str, local_rank: str | None) -> str:
    """The core of ``cores`` (a core list, one core per local rank) that rank ``local_rank`` gets."""
    try:
        listed = parse_core_list(cores, "CORES")
    except CoreListError as exc:
        raise SystemExit(f"trnlab.rank_cores: {exc}\n{USAGE}") from None
    if local_rank is None or not local_rank.isdigit():
        raise SystemExit("trnlab.rank_cores: LOCAL_RANK is not set: start it with torchrun, one process per "
                         f"core, e.g. torchrun --nproc-per-node={len(listed)} -m trnlab.rank_cores {cores} train.py")
    if int(local_rank) >= len(listed):
        raise SystemExit(f"trnlab.rank_cores: local rank {local_rank} has no core: {cores!r} names "
                         f"{len(listed)}; give one core per process (--nproc-per-node={len(listed)})")
    return str(listed[int(local_rank)])


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
        if not os.path.isfile(script):
            raise SystemExit(f"trnlab.rank_cores: no script {script!r} (run from the folder that holds it, "
                             f"or give its path)\n{USAGE}")
        sys.argv = [script, *argv[2:]]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
