"""Shared fixtures: a fake Neuron device for the neuron branch, and the bundled model."""

from __future__ import annotations

import sys
import types

import pytest
import torch


class FakeNeuronModule(types.ModuleType):
    """Stands in for ``torch.neuron`` as torch-neuronx registers it on a trn instance."""

    def __init__(self, count: int = 4, bf16: bool = True):
        super().__init__("torch.neuron")
        self.count, self.bf16 = count, bf16

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def is_bf16_supported(self) -> bool:
        return self.bf16

    # torch.manual_seed seeds every registered device module through these two.
    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        self.seed = seed


@pytest.fixture
def fake_neuron(monkeypatch):
    """Make this process look like a trn instance with 4 NeuronCores.

    Installs a fake ``torch_neuronx`` module and ``torch.neuron`` device module, and names
    PyTorch's private backend "neuron" as torch-neuronx does. That rename cannot be undone,
    and once it is done PyTorch (dynamo among others) expects a ``torch.neuron`` module: so
    afterwards ``torch.neuron`` stays as a module with no device, which every test sees as
    "no Neuron here". Yields the fake device module; set ``.count`` to change it.
    """
    module = FakeNeuronModule()
    fake_neuronx = types.ModuleType("torch_neuronx")
    fake_neuronx.__version__ = "0.0.0+fake"
    monkeypatch.setitem(sys.modules, "torch_neuronx", fake_neuronx)
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch.neuron = module
    yield module
    torch.neuron = FakeNeuronModule(count=0)


@pytest.fixture
def no_accelerator(monkeypatch):
    """Hide CUDA and Neuron, so the CPU path is taken even on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if torch._C._get_privateuse1_backend_name() == "neuron":  # renamed by fake_neuron earlier
        monkeypatch.setattr(torch, "neuron", FakeNeuronModule(count=0))
    else:
        monkeypatch.delattr(torch, "neuron", raising=False)
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like when absent


@pytest.fixture
def one_torch_thread():
    """Run the test with one intra-op thread: on a shared 2-core machine a second thread makes
    tiny-model training steps many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
