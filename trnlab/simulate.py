"""A SIMULATED Neuron device: watch the real libraries take their Neuron branches, without Trainium.

:func:`simulate_neuron` makes this process look like a trn2 instance with ``cores`` logical
NeuronCores *for the libraries' decisions only*. It registers a ``torch.neuron`` device module
the way TorchNeuron does (``torch.utils.rename_privateuse1_backend("neuron")`` plus a
``torch.neuron`` module whose ``is_available()`` is ``device_count() > 0``), puts a stand-in
``torch_neuronx`` in ``sys.modules`` (Transformers and Accelerate look for it with
``importlib.util.find_spec``), hides CUDA (a trn2 instance has none) and clears the answers the
libraries cached. Inside it, the unmodified Transformers and Accelerate code answers as on
Trainium: ``TrainingArguments`` picks ``neuron:0`` and the ``"neuron"`` compile backend,
Accelerate's ``PartialState`` picks the ``neuron`` device, generate accepts a ``neuron`` model
for auto-compilation, and ``device_map="auto"`` still loads on CPU (the page's pitfall).

What it is NOT: a Neuron device. No tensor can be placed on it (PyTorch's private backend has
no kernels here: ``torch.zeros(1, device="neuron")`` raises), nothing is compiled for it and
nothing is measured on it. The helpers below show *decisions*, never speed or numbers. Every
object and line it produces says SIMULATED.

One thing cannot be undone: PyTorch allows renaming its private backend once per process. After
the first simulation ``torch.device("neuron")`` stays a valid device name,
``torch.accelerator.current_accelerator()`` keeps answering ``device(type='neuron')``, and
``torch.neuron`` stays a module with no device (``device_count() == 0``; PyTorch needs the module
after the rename), so ``torch.accelerator.is_available()`` and every library say "no Neuron"
again. Everything else is restored on exit. PyTorch puts a renamed private backend before CUDA,
so on a GPU machine ``torch.accelerator`` then stops seeing the GPU for the rest of the process
(``torch.cuda`` still works): :func:`simulated_decisions` therefore asks in a subprocess by default.

The claim helpers (``claim_*``) each run one real library call inside a simulation and return a
:class:`SimulatedDecision` whose text is the same on every machine (CPU or CUDA, float32 or
bfloat16): the notebooks print them in checked cells.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import tempfile
import types
import warnings
from dataclasses import dataclass, field

import torch

from trnlab import compat
from trnlab.assets import BUNDLED_MODEL_DIR
from trnlab.device import pick_device, resolve_device_map
from trnlab.deprecation import warn_deprecated
from trnlab.settings import progress_bars, quiet_transformers

__all__ = [
    "CLAIMS",
    "SIMULATION_NOTICE",
    "SimulatedDecision",
    "ReportingDevice",
    "SimulatedNeuronModule",
    "claim_device_map_auto",
    "claim_generate_auto_compile",
    "claim_neuron_device",
    "claim_torch_compile_backend",
    "claim_training_device",
    "simulate_neuron",
    "simulated_decisions",
    "simulation_active",
]

# =============================================================================================
# The simulated device module
# =============================================================================================

#: The line every simulated output starts with: it says nothing here runs on Trainium.
SIMULATION_NOTICE = ("SIMULATED Neuron device (trnlab.simulate_neuron): torch.neuron reports {cores} "
                     "NeuronCore(s) for the libraries' decisions only; no Trainium here, nothing runs "
                     "on it, nothing is measured.")

_SIMULATED_VERSION = "0.0.0+simulated"
_MISSING = object()


class SimulatedNeuronModule(types.ModuleType):
    """``torch.neuron`` as TorchNeuron registers it on a trn2 instance, SIMULATED by trnlab.

    Answers the questions libraries ask to *decide* (is there a device, how many, bf16, which
    is current) and nothing else: it has no memory, stream or compile functions, and no tensor
    can live on its device. ``cores=0`` is what stays behind after a simulation ends.
    """

    simulated = True

    def __init__(self, cores: int = 4, bf16: bool = True):
        super().__init__("torch.neuron", "torch.neuron SIMULATED by trnlab: no Trainium here.")
        if cores < 0:
            raise ValueError(f"cores must be >= 0, got {cores}")
        self.cores, self.bf16 = int(cores), bool(bf16)
        self._current = 0
        self.seed = None

    def __repr__(self) -> str:
        if self.cores:
            return (f"<module 'torch.neuron' (SIMULATED by trnlab: {self.cores} NeuronCore(s) that "
                    "do not exist, no Trainium here)>")
        return ("<module 'torch.neuron' (left by trnlab.simulate_neuron: no device; PyTorch's "
                "backend rename cannot be undone)>")

    @property
    def count(self) -> int:
        """Alias of ``cores`` (the tests' old fake device used this name)."""
        return self.cores

    @count.setter
    def count(self, value: int) -> None:
        self.cores = int(value)

    # --- what TorchNeuron's module answers -------------------------------------------------
    def device_count(self) -> int:
        return self.cores

    def is_available(self) -> bool:
        return self.device_count() > 0

    def is_bf16_supported(self) -> bool:
        return self.bf16 and self.is_available()

    def current_device(self) -> int:
        return self._current

    def set_device(self, device) -> None:
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if not 0 <= index < self.cores:
            raise RuntimeError(f"simulated neuron:{index} does not exist: {self.cores} NeuronCore(s)")
        self._current = index

    def get_device_name(self, device=None) -> str:
        return "NeuronCore-v3 (SIMULATED by trnlab)"

    # torch.manual_seed seeds every registered device module through these two (the first is
    # torch's private hook name, compat.DEVICE_MODULE_BAD_FORK_HOOK, checked by tests/test_compat.py).
    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed(self, seed: int) -> None:
        self.seed = int(seed)

    def manual_seed_all(self, seed: int) -> None:
        self.seed = int(seed)


def _simulated_torch_neuronx() -> types.ModuleType:
    module = types.ModuleType("torch_neuronx", "torch_neuronx SIMULATED by trnlab: not installed here.")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)  # find_spec() needs one
    module.__version__ = _SIMULATED_VERSION
    module.simulated = True
    return module


def simulation_active() -> bool:
    """True inside :func:`simulate_neuron` (``torch.neuron`` is a simulated module with cores)."""
    module = getattr(torch, "neuron", None)
    return bool(getattr(module, "simulated", False) and module.cores > 0)


@contextlib.contextmanager
def simulate_neuron(cores: int = 4, bf16: bool = True, notice: bool = True, hide_cuda: bool = True):
    """Make this process look like a trn2 instance with ``cores`` NeuronCores, for decisions only.

    Yields the :class:`SimulatedNeuronModule` installed as ``torch.neuron``. ``notice`` prints
    the one-line :data:`SIMULATION_NOTICE` on entry. ``hide_cuda`` makes ``torch.cuda`` report no
    GPU inside (a trn2 instance has none; otherwise Accelerate would pick CUDA first). Nothing
    can run on the simulated device: see the module docstring. On exit everything is restored,
    except what PyTorch cannot undo (the backend name; ``torch.neuron`` then has 0 cores).
    """
    name = compat.privateuse1_backend_name()
    if name not in ("privateuseone", "neuron"):
        raise RuntimeError(f"PyTorch's private backend is already named {name!r} in this process; "
                           "it can be renamed only once, so Neuron cannot be simulated here.")
    module = SimulatedNeuronModule(cores, bf16)
    saved_attr = torch.__dict__.get("neuron", _MISSING)
    saved_modules = {key: sys.modules.get(key, _MISSING) for key in ("torch.neuron", "torch_neuronx")}
    saved_states = [(state, dict(state)) for state in compat.accelerate_shared_states()]
    saved_cuda = (torch.cuda.is_available, torch.cuda.device_count)
    active = [True]

    if name != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    if saved_attr is _MISSING:
        compat.register_device_module("neuron", module)  # sets torch.neuron and sys.modules["torch.neuron"]
    else:
        torch.neuron = module
        sys.modules["torch.neuron"] = module
    sys.modules["torch_neuronx"] = _simulated_torch_neuronx()
    if hide_cuda:
        # These answer "no GPU" only while this simulation is active, so a monkeypatch that
        # recorded them and restores them after the exit cannot leave CUDA hidden.
        real_available, real_count = saved_cuda
        torch.cuda.is_available = lambda: False if active[0] else real_available()
        torch.cuda.device_count = lambda: 0 if active[0] else real_count()
    for state, _ in saved_states:
        state.clear()  # let Accelerate choose its device afresh, on the simulated instance
    compat.clear_detection_caches()
    if notice:
        print(SIMULATION_NOTICE.format(cores=cores))
    try:
        yield module
    finally:
        active[0] = False
        torch.cuda.is_available, torch.cuda.device_count = saved_cuda
        _restore(saved_attr, saved_modules, saved_states)


def _restore(saved_attr, saved_modules: dict, saved_states: list) -> None:
    # The exit of simulate_neuron: torch.neuron, sys.modules and Accelerate's states as they were.
    # PyTorch needs a torch.neuron after the rename: leave one without devices.
    leftover = SimulatedNeuronModule(cores=0) if saved_attr is _MISSING else saved_attr
    torch.neuron = leftover
    for key, value in saved_modules.items():
        if value is not _MISSING:
            sys.modules[key] = value
        elif key == "torch.neuron":
            sys.modules[key] = leftover
        else:
            sys.modules.pop(key, None)
    for state in compat.accelerate_shared_states():
        state.clear()
    for state, snapshot in saved_states:
        state.update(snapshot)
    compat.clear_detection_caches()


# =============================================================================================
# One helper per claim of the page: the real libraries' answers inside a simulation
# =============================================================================================


@dataclass(frozen=True)
class SimulatedDecision:
    """What the real library decided inside :func:`simulate_neuron`: printable, deterministic."""

    claim: int
    question: str
    answer: str
    values: dict = field(default_factory=dict, compare=False)
    simulated: bool = True

    def __str__(self) -> str:
        return f"SIMULATED claim {self.claim}: {self.question} -> {self.answer}"


class ReportingDevice:
    """Context manager: ``model.device`` reports ``device`` (e.g. ``"neuron:0"``) while its
    weights stay where they are. Generate's compile decision reads only ``model.device``, so this
    shows that decision honestly; running the model still uses the real (CPU) weights."""

    def __init__(self, model, device):
        self.model, self.device = model, torch.device(device)

    def __enter__(self):
        self._class = type(self.model)
        reported = self.device
        self.model.__class__ = type(f"{self._class.__name__}ReportingSimulated{reported.type.title()}",
                                    (self._class,),
                                    {"device": property(lambda _: reported), "simulated": True})
        return self.model

    def __exit__(self, *exc):
        self.model.__class__ = self._class
        return False


class reporting_device(ReportingDevice):
    """Deprecated alias of :class:`ReportingDevice` (removed in trnlab 0.3)."""

    def __init__(self, model, device):
        warn_deprecated("simulate.reporting_device", "trnlab.simulate.ReportingDevice(model, device)")
        super().__init__(model, device)


def _bundled_model(device_map=None):
    from transformers import AutoModelForCausalLM

    with progress_bars(False):
        kwargs = {} if device_map is None else {"device_map": device_map}
        return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL_DIR, dtype=torch.float32, **kwargs).eval()


def claim_neuron_device(cores: int = 4) -> SimulatedDecision:
    """Claim 1: what the page's ``print(torch.neuron.is_available(), torch.neuron.device_count())`` prints
    on a simulated trn2.3xlarge, and what PyTorch and trnlab make of that device.

    The count is an input, not a finding: the simulation is told ``cores`` (4 logical NeuronCores,
    one Trainium2 chip at the default LNC=2). What is decided is everything built on it: the page's
    line printed as it would print, ``torch.accelerator`` (PyTorch's own code) reporting a ``neuron``
    accelerator through the registered module, and :func:`trnlab.pick_device` choosing ``neuron:0``.
    """
    import io

    with simulate_neuron(cores, notice=False):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            print(torch.neuron.is_available(), torch.neuron.device_count())  # the page's line, as written
        accelerator = torch.accelerator.current_accelerator()
        values = {"printed": printed.getvalue().strip(), "cores_given": cores, "accelerator": str(accelerator),
                  "accelerator_count": torch.accelerator.device_count(),
                  "pick_device": str(pick_device("auto", verbose=False))}
    answer = (f"prints {values['printed']!r} (the {cores} cores are the simulation's input, not detected); "
              f"torch.accelerator.current_accelerator() -> {values['accelerator']}, device_count() -> "
              f"{values['accelerator_count']}; trnlab.pick_device() -> {values['pick_device']}")
    return SimulatedDecision(1, "print(torch.neuron.is_available(), torch.neuron.device_count())", answer, values)


def claim_device_map_auto() -> SimulatedDecision:
    """Claim 3: ``from_pretrained(..., device_map="auto")`` loads the bundled model on CPU even on
    Neuron; :func:`trnlab.device.resolve_device_map` turns ``"auto"`` into ``"neuron"`` (with its
    warning). The model is really loaded (on CPU); nothing is loaded onto the simulated device."""
    with simulate_neuron(notice=False):
        model = _bundled_model(device_map="auto")
        landed = str(model.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fixed = resolve_device_map("auto")
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    values = {"auto_lands_on": landed, "hf_device_map": dict(getattr(model, "hf_device_map", {}) or {}),
              "resolve_device_map": fixed, "warning": said[0] if said else None}
    return SimulatedDecision(3, 'from_pretrained(device_map="auto").device; trnlab.resolve_device_map("auto")',
                             f"{landed}; {fixed!r} (warns: device_map='auto' does not see Neuron)"
                             if said else f"{landed}; {fixed!r}", values)


def _training_arguments(**kwargs):
    from transformers import TrainingArguments

    # quiet: e.g. "speedups for torchdynamo mostly come with GPU Ampere"
    with quiet_transformers(), tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(output_dir=output_dir, report_to="none", **kwargs)
        _ = args.device  # chooses the device now, inside the simulation
    return args


def claim_training_device() -> SimulatedDecision:
    """Claim 7: ``TrainingArguments`` chooses ``neuron:0`` by itself; ``bf16`` stays False
    (every Trainium generation supports bf16, but the course must pass ``bf16=True``)."""
    with simulate_neuron(notice=False):
        args = _training_arguments()
        device, bf16, n_gpu = str(args.device), args.bf16, args.n_gpu
        bf16_ok = bool(_training_arguments(bf16=True).bf16)  # bf16=True is accepted on Neuron
    values = {"device": device, "bf16": bf16, "bf16_accepted": bf16_ok, "n_gpu": n_gpu}
    return SimulatedDecision(7, "TrainingArguments(output_dir).device, .bf16",
                             f"{device}, bf16={bf16} (bf16=True accepted: {bf16_ok})", values)


def claim_torch_compile_backend() -> SimulatedDecision:
    """Claim 8: ``TrainingArguments(torch_compile=True)`` sets ``torch_compile_backend="neuron"``."""
    with simulate_neuron(notice=False):
        backend = _training_arguments(torch_compile=True).torch_compile_backend
    return SimulatedDecision(8, "TrainingArguments(torch_compile=True).torch_compile_backend",
                             repr(backend), {"torch_compile_backend": backend})


def claim_generate_auto_compile(model=None) -> SimulatedDecision:
    """Claim 6: generate compiles the forward by itself on ``neuron`` with a static cache.

    Calls the real ``_valid_auto_compile_criteria`` with a StaticCache on the bundled model
    (loaded on CPU unless given), once as it is (cpu) and once while its ``.device`` reports
    ``neuron:0`` (:class:`ReportingDevice`; its weights stay on CPU). Also asks with a
    DynamicCache and with ``disable_compile=True``, and the default CompileConfig on neuron.
    """
    from transformers import DynamicCache, GenerationConfig, StaticCache

    model = model if model is not None else _bundled_model()
    config = GenerationConfig(cache_implementation="static")
    static = {"cache": StaticCache(config=model.config, max_cache_len=32)}
    dynamic = {"cache": DynamicCache(config=model.config)}
    values = {"cpu": compat.valid_auto_compile_criteria(model, static, config)}
    with simulate_neuron(notice=False), ReportingDevice(model, "neuron:0"):
        values["neuron"] = compat.valid_auto_compile_criteria(model, static, config)
        values["neuron_dynamic_cache"] = compat.valid_auto_compile_criteria(model, dynamic, config)
        values["neuron_disable_compile"] = compat.valid_auto_compile_criteria(
            model, static, GenerationConfig(cache_implementation="static", disable_compile=True))
        default = compat.default_compile_config(model)
    values["compile_config"] = {"backend": default.backend, "dynamic": default.dynamic, "mode": default.mode}
    answer = (f"neuron {values['neuron']} (cpu {values['cpu']}; neuron with DynamicCache "
              f"{values['neuron_dynamic_cache']}; disable_compile=True {values['neuron_disable_compile']}); "
              f"CompileConfig(backend={default.backend!r}, dynamic={default.dynamic}, mode={default.mode!r})")
    return SimulatedDecision(6, "generate auto-compiles with cache_implementation='static'", answer, values)


#: The facts file's claims a simulation can show: ``{claim number: function deciding it}``.
CLAIMS = {1: claim_neuron_device, 3: claim_device_map_auto, 6: claim_generate_auto_compile,
          7: claim_training_device, 8: claim_torch_compile_backend}


def simulated_decisions(claims=tuple(CLAIMS), isolated: bool = True) -> dict[int, SimulatedDecision]:
    """The claim helpers' decisions, by claim number (default: all of 1, 3, 6, 7 and 8).

    ``isolated=True`` (the default, for notebooks) asks them in a fresh Python process, so this
    process never renames PyTorch's private backend: after a rename ``torch.accelerator`` reports
    ``neuron`` (with no device) for the rest of the process, even on a CUDA machine, where
    DataLoader pinning, ``torch.random.fork_rng`` and dynamo's autocast state then stop seeing
    the GPU. ``isolated=False`` runs them here.
    """
    claims = [int(c) for c in claims]
    unknown = sorted(set(claims) - set(CLAIMS))
    if unknown:
        raise ValueError(f"no simulated decision for claim(s) {unknown}: choose from {sorted(CLAIMS)}")
    if not isolated:
        return {c: CLAIMS[c]() for c in claims}
    import json
    import subprocess

    code = "import sys; from trnlab.simulate import _main; sys.exit(_main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *map(str, claims)], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the simulated decisions failed in their subprocess:\n{done.stderr[-3000:]}")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {row["claim"]: SimulatedDecision(**row) for row in rows}


def _main(argv=None) -> int:
    """``python -c 'from trnlab.simulate import _main; _main()' 1 3``: the decisions as one JSON line."""
    import json
    from dataclasses import asdict

    claims = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or list(CLAIMS)
    decisions = simulated_decisions(claims, isolated=False)
    print(json.dumps([asdict(decisions[c]) for c in claims]))
    return 0

