"""Give one torchrun rank its own NeuronCore of a subset, then run the training script in that process.
``torchrun --nproc-per-node=4 -m trnlab.rank_cores 4-7 train.py ARGS``; the one place that reads or writes
``NEURON_RT_VISIBLE_CORES``. Imports no torch (it runs first) and no trnlab, so :class:`LaunchConfigError` lives here."""
from __future__ import annotations

import os
import runpy
import sys

__all__ = ["VISIBLE_CORES_VAR", "USAGE", "LaunchConfigError", "CoreListError", "parse_core_list",
           "format_core_list", "parse_neuron_cores", "visible_cores_setting", "visible_neuron_cores",
           "rank_neuron_cores", "needs_rank_cores", "core_for_this_rank", "main"]

#: The Neuron runtime variable naming the NeuronCores a process may use.
VISIBLE_CORES_VAR = "NEURON_RT_VISIBLE_CORES"
#: The command line of ``python -m trnlab.rank_cores``, shown when it is called wrongly.
USAGE = ("usage: python -m trnlab.rank_cores CORES (SCRIPT | -m MODULE) [ARGS...]  "
         "(CORES like 4-7 or 0,2,5: one core per local rank)")


class LaunchConfigError(ValueError):
    """The requested mesh does not fit the launch or the model; the message names the fix."""


class CoreListError(LaunchConfigError):
    """A core list that is not one, or too few cores for the ranks: the message shows what works."""


def parse_core_list(value, name: str = VISIBLE_CORES_VAR) -> list[int]:
    """The NeuronCore numbers a core list names, in order: ``"0-3"`` -> ``[0, 1, 2, 3]``.
    The Neuron runtime's forms: ``"3"``, ``"0-3"``, ``"0,1,4-5"``; a core named twice is refused (ranks never share one).
    Raises :class:`CoreListError` naming ``name``."""
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


def parse_neuron_cores(value: str, name: str = VISIBLE_CORES_VAR) -> list[int]:
    """The NeuronCore numbers a core list names, in order: ``"0-3"`` -> ``[0, 1, 2, 3]``.
    :func:`parse_core_list` under the launcher's name, for ``neuron_cores`` and ``--neuron-cores``."""
    return parse_core_list(value, name)


def visible_cores_setting() -> str | None:
    """``NEURON_RT_VISIBLE_CORES`` as this process has it, stripped; ``None`` when unset or empty."""
    value = os.environ.get(VISIBLE_CORES_VAR, "").strip()
    return value or None


def visible_neuron_cores(value: str | None = None) -> int | None:
    """How many NeuronCores ``NEURON_RT_VISIBLE_CORES`` allows (``None``: the variable is unset).
    ``value`` defaults to the environment variable; forms as in :func:`parse_neuron_cores`."""
    value = visible_cores_setting() if value is None else value
    if value is None or not value.strip():
        return None
    return len(parse_neuron_cores(value))


def _listed_cores(cores, visible: int | None) -> list[int]:
    """The cores ``cores`` names (a core list, ints, or ``None``: this process's own), checked."""
    if cores is None:
        from_env = visible_cores_setting()
        if from_env:
            return parse_neuron_cores(from_env)
        if visible is not None:
            return list(range(visible))
        raise CoreListError("no NeuronCores to give the ranks: pass neuron_cores='0-3' (the cores "
                            "they may use) or set NEURON_RT_VISIBLE_CORES")
    if isinstance(cores, str):
        return parse_neuron_cores(cores, "neuron_cores")
    if any(isinstance(c, bool) or not isinstance(c, int) for c in cores):
        raise CoreListError(f"neuron_cores={cores!r}: give core numbers (ints) or a core list such as '0-3'")
    listed = [int(c) for c in cores]
    if any(c < 0 for c in listed) or len(set(listed)) != len(listed):
        raise CoreListError(f"neuron_cores={cores!r}: give distinct core numbers >= 0, one per rank")
    return listed


def rank_neuron_cores(nproc: int, cores=None, visible: int | None = None) -> list[int]:
    """The NeuronCore of each local rank: rank ``i`` gets the ``i``-th core of ``cores``.
    ``cores``: ``"4-7"``, ``"0,2"`` or a list of ints; ``None``: ``NEURON_RT_VISIBLE_CORES``, else all visible cores.
    The Neuron runtime reserves every core a process sees, so no two ranks may see the same one."""
    listed = _listed_cores(cores, visible)
    if len(listed) < nproc:
        raise CoreListError(
            f"{nproc} ranks need {nproc} NeuronCores, one each, but only {len(listed)} are given "
            f"({','.join(map(str, listed)) or 'none'}): name more cores, or launch fewer processes.")
    return listed[:nproc]


def needs_rank_cores(device: str, neuron_cores=None) -> bool:
    """Whether the ranks need this module to get one NeuronCore each.
    TorchNeuron sets ``NEURON_RT_VISIBLE_CORES=LOCAL_RANK`` in each rank when unset (source snapshot, trainium-facts), so
    only a subset needs it: ``neuron_cores`` given or the variable set here. Off Trainium only ``neuron_cores`` counts."""
    if neuron_cores is not None:
        return True
    return device == "neuron" and visible_cores_setting() is not None


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
    """``python -m trnlab.rank_cores CORES SCRIPT ...``: run SCRIPT with this rank's NeuronCores visible."""
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
