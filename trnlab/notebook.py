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
    ``device=None`` reads ``TRNLAB_DEVICE``; on CPU torch gets ``cpu_threads`` threads (``None``: ``TRNLAB_CPU_THREADS``,
    default 1; 0 keeps torch's choice). Starts the clock and graph count of :func:`run_summary`."""
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
    Dynamo's count first, then the trn2 cost marked as an estimate with its source; on Neuron also the NEFF count of
    ``torch.neuron.get_dynamo_metrics()``."""
    if not _run:
        raise RuntimeError("trnlab.run_summary() reports what ran since trnlab.setup(): call "
                           "trnlab.setup() at the top of the notebook first.")
    graphs = graphs_compiled() - _run["graphs"]
    seconds = time.perf_counter() - _run["start"]
    lines = [f"this notebook compiled {graphs} graph(s) in {seconds:.0f} s on {_run['device']}",
             "on a trn2: each graph is a neuronx-cc compilation to a NEFF (a training graph two, forward and "
             "backward, as TorchNeuron compiles through AOTAutograd), which can take minutes for a large "
             f"model (an estimate, from the {COMPILE_TIME_SOURCE}; no figure is published for a model as small "
             "as the course's); a warm NEFF cache (TORCH_NEURONX_NEFF_CACHE_DIR) lets a re-run skip them"]
    metrics = neuron_graph_metrics()
    if metrics is not None:
        if len(metrics) >= _run["neffs"]:
            since, neffs = "since setup()", len(metrics) - _run["neffs"]
        else:   # reset since setup(): count what is there
            since, neffs = "since torch.neuron.reset_dynamo_metrics() was last called", len(metrics)
        what = ("graph(s) the STAND-IN backend received, no NEFF" if getattr(torch.neuron, "standin", False)
                else "NEFF(s) compiled")
        lines.append(f"torch.neuron.get_dynamo_metrics(): {neffs} {what} {since}")
    return "\n".join(lines)
