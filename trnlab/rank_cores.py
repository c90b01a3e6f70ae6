"""Give one torchrun rank its own NeuronCore of a subset, then run the training script in that process:
``torchrun --nproc-per-node=4 -m trnlab.rank_cores 4-7 train.py ARGS``. The one place that reads or writes
``NEURON_RT_VISIBLE_CORES``; it runs before torch is imported, so it imports no torch and of trnlab only settings."""
from __future__ import annotations

import os
import runpy
import sys
from itertools import groupby

from trnlab.settings import SettingError, whole_number

__all__ = ["rank_neuron_cores"]

_VISIBLE_CORES_VAR = "NEURON_RT_VISIBLE_CORES"  # the Neuron runtime's: the NeuronCores a process may use
_USAGE = "usage: python -m trnlab.rank_cores CORES SCRIPT [ARGS...]  (CORES: 4-7 or 0,2,5, one per rank)"


def _parse_core_list(value, name: str = _VISIBLE_CORES_VAR) -> list[int]:
    """The cores a core list names, in order: ``"0,1,4-5"`` -> ``[0, 1, 4, 5]`` (the Neuron runtime's forms).
    A core named twice is refused (ranks never share one); a bad list is a :class:`SettingError` naming ``name``."""
    cores: list[int] = []
    for part in str(value).replace(" ", "").split(","):
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()) or int(last or first) < int(first):
            raise SettingError(f"{name}={value!r} is not a core list: use e.g. '0-3' or '0,1,2,3' "
                               "(core numbers >= 0, ranges low-high)")
        for core in range(int(first), int(last or first) + 1):
            if core in cores:
                raise SettingError(f"{name}={value!r} names core {core} twice: each rank needs its own "
                                   "core, so list every core once (e.g. '0-3')")
            cores.append(core)
    return cores


def _format_core_list(cores) -> str:
    """A core list in the runtime's short form, runs as ranges: ``[4, 5, 6, 7, 9]`` -> ``"4-7,9"``."""
    runs = [[c for _, c in run] for _, run in groupby(enumerate(map(int, cores)), lambda ic: ic[1] - ic[0])]
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _visible_cores_setting() -> str | None:
    """``NEURON_RT_VISIBLE_CORES`` as this process has it, stripped; ``None`` when unset or empty."""
    return os.environ.get(_VISIBLE_CORES_VAR, "").strip() or None


def _listed_cores(cores) -> list[int]:
    """The cores ``cores`` names (a core list, a list of core numbers, or ``None``: this process's own), checked."""
    if cores is None:
        if from_env := _visible_cores_setting():
            return _parse_core_list(from_env)
        raise SettingError("no NeuronCores to give the ranks: pass neuron_cores='0-3' (the cores "
                           "they may use) or set NEURON_RT_VISIBLE_CORES")
    if isinstance(cores, str):
        return _parse_core_list(cores, "neuron_cores")
    if not isinstance(cores, (list, tuple, range)) or any(isinstance(c, bool) or not isinstance(c, int) for c in cores):
        raise SettingError(f"neuron_cores={cores!r}: give core numbers as a list (e.g. [4, 5]) or a core list "
                           "string (e.g. '4-7' or '0,2,5')")
    if not cores:
        raise SettingError(f"neuron_cores={cores!r} names no core: list the cores the ranks use (e.g. [0, 1] or "
                           "'0-1'), or leave neuron_cores out for all of them")
    if any(c < 0 for c in cores) or len(set(cores)) != len(cores):
        raise SettingError(f"neuron_cores={cores!r}: give distinct core numbers >= 0, one per rank")
    return list(cores)


def rank_neuron_cores(nproc: int, cores=None) -> list[int]:
    """The NeuronCore of each local rank: rank ``i`` gets the ``i``-th of ``cores`` (``"4-7"``, ``"0,2"``, ``[4, 5]``;
    ``None``: ``NEURON_RT_VISIBLE_CORES``). The runtime reserves every core a process sees: no two ranks share one."""
    listed = _listed_cores(cores)
    if len(listed) < whole_number("nproc", nproc):
        raise SettingError(f"{nproc} ranks need {nproc} NeuronCores, one each, but only {len(listed)} are given "
                           f"({','.join(map(str, listed)) or 'none'}): name more cores, or launch fewer processes.")
    return listed[:nproc]


def _core_for_this_rank(cores: str, local_rank: str | None) -> str:
    """The core of ``cores`` (one per local rank) that local rank ``local_rank`` gets, else a SystemExit saying why."""
    try:
        listed = _parse_core_list(cores, "CORES")
    except SettingError as exc:
        raise SystemExit(f"trnlab.rank_cores: {exc}\n{_USAGE}") from None
    start = (f"start it with torchrun, one process per core, e.g. torchrun --nproc-per-node={len(listed)} "
             f"-m trnlab.rank_cores {cores} train.py")
    if not local_rank:
        raise SystemExit(f"trnlab.rank_cores: LOCAL_RANK is not set: {start}")
    if not local_rank.isdigit():
        raise SystemExit(f"trnlab.rank_cores: LOCAL_RANK={local_rank!r} is set but not a whole number (torchrun "
                         f"sets 0, 1, ...): {start}")
    if int(local_rank) >= len(listed):
        raise SystemExit(f"trnlab.rank_cores: local rank {local_rank} has no core: {cores!r} names "
                         f"{len(listed)}; give one core per process (--nproc-per-node={len(listed)})")
    return str(listed[int(local_rank)])


def _main(argv: list[str] | None = None) -> None:
    """``python -m trnlab.rank_cores CORES SCRIPT ...``: run SCRIPT with this rank's NeuronCore visible."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        raise SystemExit(_USAGE)
    os.environ[_VISIBLE_CORES_VAR] = _core_for_this_rank(argv[0], os.environ.get("LOCAL_RANK"))
    script = argv[1]
    if not os.path.isfile(script):
        raise SystemExit(f"trnlab.rank_cores: no script {script!r} (run from the folder that holds it, "
                         f"or give its path)\n{_USAGE}")
    sys.argv = [script, *argv[2:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _main()
