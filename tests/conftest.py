"""Shared fixtures: a fake Neuron device for the neuron branch, no accelerator, one torch thread."""

from __future__ import annotations

import sys

import pytest
import torch

from fake_neuron import FakeNeuronModule, fake_neuron as faked
from trnlab.compat import clear_detection_caches, privateuse1_backend_name


@pytest.fixture
def fake_neuron():
    """A fake ``torch.neuron`` with 4 devices, a ``torch_neuronx``, CUDA hidden (tests/fake_neuron.py); set ``.cores``.

    Not built on ``monkeypatch``: a test's own monkeypatch is then undone before the fake's restore.
    """
    with faked(cores=4, bf16=True) as module:
        yield module


@pytest.fixture
def no_accelerator(monkeypatch):
    """Hide CUDA and Neuron, so the CPU path is taken even on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like when absent
    saved = torch.__dict__.get("neuron")
    if privateuse1_backend_name() == "neuron":  # renamed by a fake earlier: PyTorch needs a module
        torch.neuron = FakeNeuronModule(cores=0)
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
