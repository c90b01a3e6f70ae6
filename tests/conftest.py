"""Shared fixtures: the simulated Neuron device for the neuron branch, and the bundled model."""

from __future__ import annotations

import sys

import pytest
import torch

from trnlab.compat import clear_detection_caches, privateuse1_backend_name
from trnlab.simulate import SimulatedNeuronModule, simulate_neuron


@pytest.fixture
def fake_neuron():
    """Make this process look like a trn2 instance with 4 NeuronCores: trnlab's simulated device.

    :func:`trnlab.simulate.simulate_neuron` registers a SIMULATED ``torch.neuron`` (and a stand-in
    ``torch_neuronx``), hides CUDA and clears the libraries' cached answers, so trnlab,
    Transformers and Accelerate all take their Neuron branches; it restores everything on exit,
    except the backend rename PyTorch cannot undo (``torch.neuron`` then has no device). Yields
    the simulated module; set ``.cores`` (or ``.count``) to change it. Deliberately not built on
    ``monkeypatch``: a test's own monkeypatch is then undone before the simulation ends.
    """
    with simulate_neuron(cores=4, bf16=True, notice=False) as module:
        sys.modules["torch_neuronx"].__version__ = "0.0.0+fake"  # what tests/test_device.py expects
        yield module


@pytest.fixture
def no_accelerator(monkeypatch):
    """Hide CUDA and Neuron, so the CPU path is taken even on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like when absent
    saved = torch.__dict__.get("neuron")
    if privateuse1_backend_name() == "neuron":  # renamed by a simulation earlier: keep a module
        torch.neuron = SimulatedNeuronModule(cores=0)
    elif saved is not None:
        del torch.neuron
    clear_detection_caches()  # torch.accelerator caches the torch.neuron it saw last
    yield
    if saved is not None:
        torch.neuron = saved
    else:
        torch.__dict__.pop("neuron", None)
    clear_detection_caches()


@pytest.fixture
def one_torch_thread():
    """Run the test with one intra-op thread: on a shared 2-core machine a second thread makes
    tiny-model training steps many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
