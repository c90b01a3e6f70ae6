"""The one setup call at the top of every notebook, and the summary line at its end."""

from __future__ import annotations

import random
import time

import torch

from trnlab.compile_tracking import graphs_compiled, neuron_graph_metrics
from trnlab.device import core_holders_notice, neuron_ls_output, package_versions, pick_device
from trnlab.settings import read_settings

__all__ = ["COMPILE_TIME_SOURCE", "setup", "run_summary"]

#: Where the trn2 per-compile estimate of :func:`run_summary` comes from (a published statement,
#: not a measurement of this course: no compile time of the tiny course model is published).
COMPILE_TIME_SOURCE = ('Neuron docs, "How to optimize a model with torch.compile": the first call with a new '
                       'input signature "can take several minutes for large models"')

# What setup() saw when it ran: run_summary() reports the difference.
_run: dict = {}


def setup(device: str | None = None, seed: int = 0, cpu_threads: int | None = None) -> torch.device:
    """Seed every generator, print versions, who holds NeuronCores and the device, and return that device.

    ``device=None`` reads ``TRNLAB_DEVICE`` (see :func:`trnlab.read_settings`). On CPU it
    sets torch's thread count to ``cpu_threads`` (``None``: ``TRNLAB_CPU_THREADS``, default
    1; 0 keeps torch's choice): on a shared 2-core machine one thread trains the tiny model
    several times faster than two. It also starts the clock and the graph count that
    :func:`run_summary` reports. Called once in every notebook, after the parameter cell.
    """
    current = read_settings()
    random.seed(seed)
    torch.manual_seed(seed)
    versions = package_versions()
    print(", ".join(f"{name} {version}" for name, version in versions.items() if version))
    chosen = pick_device(device if device is not None else current.device)
    threads = current.cpu_threads if cpu_threads is None else cpu_threads
    if chosen.type == "cpu" and threads:
        torch.set_num_threads(threads)
    print(core_holders_notice(neuron_ls_output(), backend=chosen.type))
    print(f"device: {chosen}")
    _run.update(start=time.perf_counter(), graphs=graphs_compiled(),
                neffs=len(neuron_graph_metrics() or []), device=str(chosen))
    return chosen


def run_summary() -> str:
    """How many graphs this notebook compiled since :func:`setup`, in how long, and what that means on a trn2.

    The first line is ``this notebook compiled {G} graph(s) in {T} s on {device}`` (dynamo's
    count); the next says what that costs on a trn2, marked as an estimate with its source; on
    Neuron a third gives the NEFF count of ``torch.neuron.get_dynamo_metrics()``. The last cell
    of every notebook prints it, and the notebook's introduction quotes it.
    """
    if not _run:
        raise RuntimeError("trnlab.run_summary() reports what ran since trnlab.setup(): call "
                           "trnlab.setup() at the top of the notebook first.")
    graphs = graphs_compiled() - _run["graphs"]
    seconds = time.perf_counter() - _run["start"]
    lines = [f"this notebook compiled {graphs} graph(s) in {seconds:.0f} s on {_run['device']}",
             "on a trn2: each graph is a neuronx-cc compilation to a NEFF, which can take minutes for a large "
             f"model (an estimate, from the {COMPILE_TIME_SOURCE}; no figure is published for a model as small "
             "as the course's); a warm NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR) lets a re-run skip them"]
    metrics = neuron_graph_metrics()
    if metrics is not None:
        if len(metrics) >= _run["neffs"]:
            since, neffs = "since setup()", len(metrics) - _run["neffs"]
        else:   # reset since setup(): count what is there
            since, neffs = "since torch.neuron.reset_dynamo_metrics() was last called", len(metrics)
        lines.append(f"torch.neuron.get_dynamo_metrics(): {neffs} NEFF(s) compiled {since}")
    return "\n".join(lines)
