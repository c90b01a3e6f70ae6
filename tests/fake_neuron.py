"""A fake torch.neuron for unit tests of trnlab's neuron branches; tests/test_standin.py runs the real code on the stand-in."""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types

import torch

from trnlab import _compat

_MISSING = object()


class FakeNeuronModule(types.ModuleType):
    """``torch.neuron`` answering what libraries ask to decide (a device? how many? bf16?); no tensor lives on it."""

    def __init__(self, cores: int = 4, bf16: bool = True):
        super().__init__("torch.neuron", "a fake torch.neuron for trnlab's unit tests")
        self.cores, self.bf16, self._current = int(cores), bool(bf16), 0

    @property
    def count(self) -> int:
        return self.cores

    @count.setter
    def count(self, value: int) -> None:
        self.cores = int(value)

    def device_count(self) -> int:
        return self.cores

    def is_available(self) -> bool:
        return self.cores > 0

    def is_bf16_supported(self) -> bool:
        return self.bf16 and self.is_available()

    def current_device(self) -> int:
        return self._current

    def set_device(self, device) -> None:
        self._current = device if isinstance(device, int) else torch.device(device).index or 0

    def _is_in_bad_fork(self) -> bool:  # _compat.DEVICE_MODULE_BAD_FORK_HOOK: torch.manual_seed asks it first
        return False

    def manual_seed_all(self, seed: int) -> None:
        """Nothing to seed: no tensor lives here."""


def accelerate_shared_states() -> list[dict]:
    """The Borg dicts behind Accelerate's ``PartialState`` and ``AcceleratorState``, which remember the first device.
    Empty when Accelerate's state module is not imported yet."""
    state = sys.modules.get("accelerate.state")
    return [] if state is None else [state.PartialState._shared_state, state.AcceleratorState._shared_state]


@contextlib.contextmanager
def fake_neuron(cores: int = 4, bf16: bool = True):
    """``torch.neuron`` faked with ``cores`` devices, a ``torch_neuronx`` in sys.modules, CUDA hidden and the
    libraries' cached answers cleared; all restored on exit but PyTorch's backend rename (then 0 cores)."""
    name = _compat.privateuse1_backend_name()
    if name not in ("privateuseone", "neuron"):
        raise RuntimeError(f"PyTorch's private backend is already named {name!r}: it can be renamed only once")
    module = FakeNeuronModule(cores, bf16)
    saved_attr = torch.__dict__.get("neuron", _MISSING)
    saved_modules = {key: sys.modules.get(key, _MISSING) for key in ("torch.neuron", "torch_neuronx")}
    saved_states = [(state, dict(state)) for state in accelerate_shared_states()]
    saved_cuda, active = (torch.cuda.is_available, torch.cuda.device_count), [True]
    if name != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    if saved_attr is _MISSING:
        _compat.register_device_module("neuron", module)
    else:
        torch.neuron = sys.modules["torch.neuron"] = module
    neuronx = sys.modules["torch_neuronx"] = types.ModuleType("torch_neuronx", "a fake torch_neuronx")
    neuronx.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)  # importlib.util.find_spec needs one
    neuronx.__version__ = "0.0.0+fake"
    # "no GPU" only while active: a test's monkeypatch restoring these after the exit cannot leave CUDA hidden
    real_available, real_count = saved_cuda
    torch.cuda.is_available = lambda: False if active[0] else real_available()
    torch.cuda.device_count = lambda: 0 if active[0] else real_count()
    for state, _ in saved_states:
        state.clear()  # Accelerate chooses its device afresh
    _compat.clear_detection_caches()
    try:
        yield module
    finally:
        active[0] = False
        torch.cuda.is_available, torch.cuda.device_count = saved_cuda
        leftover = FakeNeuronModule(cores=0) if saved_attr is _MISSING else saved_attr  # PyTorch needs one
        torch.neuron = leftover
        for key, value in saved_modules.items():
            if value is not _MISSING:
                sys.modules[key] = value
            elif key == "torch.neuron":
                sys.modules[key] = leftover
            else:
                sys.modules.pop(key, None)
        for state in accelerate_shared_states():
            state.clear()
        for state, snapshot in saved_states:
            state.update(snapshot)
        _compat.clear_detection_caches()


class ReportingDevice:
    """``model.device`` reports ``device`` inside the block; the weights stay where they are."""

    def __init__(self, model, device):
        self.model, self.device, self._class = model, torch.device(device), type(model)

    def __enter__(self):
        reported = self.device
        self.model.__class__ = type(f"{self._class.__name__}Reporting", (self._class,),
                                    {"device": property(lambda _: reported)})
        return self.model

    def __exit__(self, *exc):
        self.model.__class__ = self._class
        return False
