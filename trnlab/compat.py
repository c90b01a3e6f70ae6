"""Every use of a library's private internals, in one place.

trnlab counts compiled graphs, resets generate's compile state and runs the stand-in neuron device
(:mod:`trnlab.standin`) through attributes that torch, Transformers and Accelerate do not promise to keep. Each
such touch is a small named function or constant here, and ``tests/test_compat.py`` checks
that every one still exists in the installed versions: an upgrade that renames one fails
that named test instead of silently counting zero graphs. No other trnlab module reaches
into a private attribute.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = [
    "ACCELERATE_DYNAMIC_ENV_VAR", "ACCELERATE_PARALLELISM_REFUSAL", "CACHED_DETECTIONS", "COMPILE_TIME_METRIC",
    "DEVICE_MODULE_BAD_FORK_HOOK", "DYNAMO_RECOMPILES_LOGGER", "GENERATE_STATE_ATTRIBUTES", "INTERNALS",
    "RECOMPILE_LIMIT_EVENT", "accelerate_shared_states", "attention_implementation", "clear_detection_caches",
    "compile_on_every_device", "cpu_mesh_as_multi_device", "default_compile_config", "dynamo_compile_seconds",
    "dynamo_counters", "dynamo_recompile_limit", "dynamo_recompile_limit_hits", "dynamo_recompiles_logger",
    "dynamo_reset", "dynamo_unique_graphs", "forget_generate_state", "generate_cache_length",
    "is_parallelism_refusal", "model_device_mesh", "no_compile_caches",
    "privateuse1_backend_name", "register_device_module", "strided_shard_class", "trainer_dynamo_plugin",
    "valid_auto_compile_criteria",
]

# ---------------------------------------------------------------------------------------------
# torch._dynamo: graph counts, compile time, recompile limit, reset
# ---------------------------------------------------------------------------------------------

#: How dynamo names the event when one function was recompiled too often.
RECOMPILE_LIMIT_EVENT = "Dynamo recompile limit exceeded"
#: The key of ``compilation_time_metrics`` that times each compile (tracing + backend).
COMPILE_TIME_METRIC = "_compile.compile_inner"


def dynamo_counters():
    """``torch._dynamo.utils.counters``: dynamo's process-wide event counters."""
    from torch._dynamo.utils import counters

    return counters


def dynamo_unique_graphs() -> int:
    """Graphs dynamo has compiled in this process (``counters["stats"]["unique_graphs"]``)."""
    return int(dynamo_counters()["stats"]["unique_graphs"])


def dynamo_recompile_limit_hits() -> int:
    """Times dynamo gave up on a function because it recompiled too often."""
    unimplemented = dynamo_counters()["unimplemented"]
    return int(sum(n for key, n in unimplemented.items() if key.startswith(RECOMPILE_LIMIT_EVENT)))


def dynamo_compile_seconds() -> float:
    """Seconds dynamo has spent compiling in this process (``compilation_time_metrics``)."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get(COMPILE_TIME_METRIC, [])))


def dynamo_reset() -> None:
    """``torch._dynamo.reset()``: drop every compiled graph and guard of this process."""
    torch._dynamo.reset()


def dynamo_recompile_limit(limit: int):
    """A context manager that sets dynamo's per-function recompile limit (8 by default)."""
    return torch._dynamo.config.patch(recompile_limit=limit)


#: The logger of dynamo's ``recompiles`` log artifact (what ``TORCH_LOGS=recompiles`` prints).
DYNAMO_RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"


def dynamo_recompiles_logger():
    """The ``logging.Logger`` dynamo writes each "Recompiling function ..." message to."""
    import logging

    import torch._dynamo.guards  # noqa: F401  (creates the artifact logger)

    return logging.getLogger(DYNAMO_RECOMPILES_LOGGER)


def no_compile_caches():
    """A context manager that turns off inductor's FX graph cache and the AOTAutograd cache,
    so every graph really compiles (the training benchmark measures cold compiles)."""
    import contextlib

    import torch._functorch.config
    import torch._inductor.config

    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


# ---------------------------------------------------------------------------------------------
# transformers generate(): compile state kept on the model, compile on every device
# ---------------------------------------------------------------------------------------------

#: Attributes ``generate()`` caches on a model: the compiled forward, its config, and the
#: largest static-cache length used so far (reused for shorter prompts).
GENERATE_STATE_ATTRIBUTES = ("_compiled_call", "_last_compile_config", "_previous_max_cache_length")


def forget_generate_state(model) -> None:
    """Drop the compiled forward and cache length ``generate()`` keeps on ``model``."""
    for name in GENERATE_STATE_ATTRIBUTES:
        model.__dict__.pop(name, None)


def generate_cache_length(model) -> int | None:
    """The static-cache length ``generate()`` last used on ``model`` (``None`` before any)."""
    return getattr(model, "_previous_max_cache_length", None)


def compile_on_every_device(config) -> None:
    """Let ``generate()`` auto-compile ``config`` on any device, CPU included.

    ``_valid_auto_compile_criteria`` compiles only on cuda/xpu/neuron/tpu unless the config
    has ``_compile_all_devices`` set; it is not a dataclass field, so it is set here.
    """
    config._compile_all_devices = True


def attention_implementation(model) -> str | None:
    """``model.config._attn_implementation`` ("eager", "sdpa", ...)."""
    return getattr(model.config, "_attn_implementation", None)


# ---------------------------------------------------------------------------------------------
# Trainer and Accelerate
# ---------------------------------------------------------------------------------------------

#: Accelerate reads this when the Trainer builds its TorchDynamoPlugin with ``dynamic`` unset.
ACCELERATE_DYNAMIC_ENV_VAR = "ACCELERATE_DYNAMO_USE_DYNAMIC"

#: Words of Accelerate's refusal of a load-time-sharded model on a device type it does not
#: accept (``ParallelismConfig is only compatible DistributedType.FSDP ...``).
ACCELERATE_PARALLELISM_REFUSAL = "ParallelismConfig"


def is_parallelism_refusal(error: BaseException) -> bool:
    """Whether ``error`` is Accelerate refusing a sharded model on this device type (MULTI_CPU)."""
    return isinstance(error, ValueError) and ACCELERATE_PARALLELISM_REFUSAL in str(error)


def trainer_dynamo_plugin(trainer):
    """The ``TorchDynamoPlugin`` the Trainer's Accelerator compiles with."""
    return trainer.accelerator.state.dynamo_plugin


@contextlib.contextmanager
def cpu_mesh_as_multi_device():
    """Let Accelerate take a model sharded at load time on a gloo CPU mesh, as it does on Trainium.

    A model loaded with ``from_pretrained(..., distributed_config=DistributedConfig(tp_size,
    fsdp_size))`` makes ``Trainer`` hand Accelerate a ``ParallelismConfig``, which Accelerate
    1.15 accepts only when ``Accelerator.multi_device`` is true (MULTI_GPU, MULTI_NEURON, ...),
    under FSDP2 or under DeepSpeed. ``multi_device`` names every multi-accelerator type but not
    MULTI_CPU, so on a CPU mesh ``Trainer(...)`` raises before training.

    Inside this block ``multi_device`` is also true for a distributed MULTI_CPU run: Accelerate
    takes the branch it takes on Trainium (MULTI_NEURON). Nothing else changes: the distributed
    type stays MULTI_CPU, the backend gloo; the model keeps its own TP/FSDP2 placement, and
    Accelerate's data loader gives the TP ranks of one fsdp coordinate the same rows. The
    property is restored on exit; build the ``Trainer`` inside, call ``train()`` outside.
    Touches the public class property ``accelerate.Accelerator.multi_device``, class-wide for the
    duration of the block (not thread-safe against Accelerators built meanwhile elsewhere).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    original = Accelerator.__dict__["multi_device"]  # the property itself

    def multi_device(self):
        return original.fget(self) or (self.use_distributed and self.distributed_type == DistributedType.MULTI_CPU)

    Accelerator.multi_device = property(multi_device, doc=original.__doc__)
    try:
        yield
    finally:
        Accelerator.multi_device = original


# ---------------------------------------------------------------------------------------------
# torch.distributed: the model's mesh, strided shards, the private backend's name
# ---------------------------------------------------------------------------------------------

def model_device_mesh(model):
    """The (pp, fsdp, tp) device mesh Transformers keeps on a sharded model (``_device_mesh``)."""
    return getattr(model, "_device_mesh", None)


def strided_shard_class():
    """``torch.distributed.tensor.placement_types._StridedShard`` (FSDP sharding a TP-split dim)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard


def privateuse1_backend_name() -> str:
    """The name of PyTorch's out-of-tree device backend ("privateuseone", or "neuron" once renamed)."""
    return torch._C._get_privateuse1_backend_name()


# ---------------------------------------------------------------------------------------------
# A neuron device module (trnlab.standin, the tests' fake): registering it, the libraries'
# cached answers about Neuron, Accelerate's remembered device, generate's compile decision
# ---------------------------------------------------------------------------------------------

def register_device_module(name: str, module) -> None:
    """``torch._register_device_module``: how out-of-tree backends install ``torch.<name>``."""
    torch._register_device_module(name, module)


#: The hook ``torch.manual_seed`` calls on every registered device module before seeding it
#: (``torch.random``'s ``_bad_fork_name``): a device module defines a method of this name
#: (:class:`trnlab.standin.StandInNeuronModule` does).
DEVICE_MODULE_BAD_FORK_HOOK = "_is_in_bad_fork"

#: lru_cache'd library functions whose answer depends on ``torch.neuron`` / CUDA: (module, name).
#: Transformers caches ``is_torch_neuron_available`` (read by TrainingArguments for the device and
#: the compile backend) and ``is_torch_bf16_gpu_available`` (read by ``bf16=True`` validation);
#: Accelerate caches ``is_neuron_available`` (read by PartialState, launch, seeding, ...).
CACHED_DETECTIONS = (
    ("transformers.utils.import_utils", "is_torch_neuron_available"),
    ("transformers.utils.import_utils", "is_torch_bf16_gpu_available"),
    ("accelerate.utils.imports", "is_neuron_available"),
)


def clear_detection_caches() -> None:
    """Forget the cached Neuron/bf16 answers of Transformers and Accelerate (``cache_clear()``
    of the lru_caches in :data:`CACHED_DETECTIONS`; modules not imported yet cache nothing), and
    torch's ``functools.cache`` of ``torch.get_device_module``, through which ``torch.accelerator``
    reaches ``torch.neuron`` (without this it keeps asking the module it saw first)."""
    import sys

    torch.get_device_module.cache_clear()
    for module_name, function_name in CACHED_DETECTIONS:
        module = sys.modules.get(module_name)
        if module is not None:
            getattr(module, function_name).cache_clear()


def accelerate_shared_states() -> list[dict]:
    """The Borg dicts behind Accelerate's singletons (``PartialState._shared_state``,
    ``AcceleratorState._shared_state``): they remember the device chosen first in the process.
    Empty when Accelerate's state module is not imported yet."""
    import sys

    state = sys.modules.get("accelerate.state")
    if state is None:
        return []
    return [state.PartialState._shared_state, state.AcceleratorState._shared_state]


def valid_auto_compile_criteria(model, model_kwargs: dict, generation_config) -> bool:
    """``GenerationMixin._valid_auto_compile_criteria``: whether generate() will compile the forward."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, generation_config))


def default_compile_config(model):
    """``PreTrainedModel._default_compile_config()``: the CompileConfig generate uses by default."""
    return model._default_compile_config()


#: Every private name above, as (what, how to find it): ``tests/test_compat.py`` checks each.
INTERNALS = {
    "dynamo counters": "torch._dynamo.utils.counters",
    "dynamo compile time": "torch._dynamo.utils.compilation_time_metrics",
    "dynamo reset": "torch._dynamo.reset",
    "dynamo recompile_limit": "torch._dynamo.config.recompile_limit",
    "dynamo recompiles log": f"logging.getLogger({DYNAMO_RECOMPILES_LOGGER!r})",
    "inductor fx_graph_cache": "torch._inductor.config.fx_graph_cache",
    "AOTAutograd cache": "torch._functorch.config.enable_autograd_cache",
    "generate compile state": "GenerationMixin attributes " + ", ".join(GENERATE_STATE_ATTRIBUTES),
    "compile on every device": "CompileConfig._compile_all_devices",
    "attention implementation": "PretrainedConfig._attn_implementation",
    "dynamo plugin": "Trainer.accelerator.state.dynamo_plugin",
    "multi-device check": "accelerate.Accelerator.multi_device, read by ParallelismConfig._validate_accelerator",
    "model mesh": "PreTrainedModel._device_mesh",
    "strided shard": "torch.distributed.tensor.placement_types._StridedShard",
    "privateuse1 name": "torch._C._get_privateuse1_backend_name",
    "register device module": "torch._register_device_module",
    "device module seeding hook": f"torch.random.manual_seed calls <device module>.{DEVICE_MODULE_BAD_FORK_HOOK}()",
    "cached detections": ", ".join(f"{m}.{f}.cache_clear" for m, f in CACHED_DETECTIONS),
    "device module cache": "torch.get_device_module.cache_clear",
    "accelerate shared states": "accelerate.state.PartialState._shared_state, AcceleratorState._shared_state",
    "auto-compile decision": "GenerationMixin._valid_auto_compile_criteria",
    "default compile config": "PreTrainedModel._default_compile_config",
}


# ---------------------------------------------------------------------------------------------
# The STAND-IN neuron device (trnlab.standin): its dynamo backend, built as TorchNeuron's is
# ---------------------------------------------------------------------------------------------

def aot_autograd(**kwargs):
    """``torch._dynamo.backends.common.aot_autograd``: a backend that runs AOTAutograd, forward and backward apart."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)


def aot_graph_name() -> str:
    """AOTAutograd's name for the graph it compiles: ``model__0_forward_1``, ``..._backward_1``, ``..._inference_0``."""
    from torch._functorch._aot_autograd.logging_utils import get_aot_graph_name

    return get_aot_graph_name()


def graph_symbolic_sizes(gm) -> list[str]:
    """The symbolic sizes (``s77``...) of a dynamo graph: its fake tensors' ``ShapeEnv.var_to_range``.

    TorchNeuron's DynamicShapeAnalysis reads them from ``meta["val"]``; dynamo 2.13 writes ``meta["example_value"]``.
    """
    for node in gm.graph.nodes:
        for key in ("val", "example_value"):
            shape_env = getattr(getattr(node.meta.get(key), "fake_mode", None), "shape_env", None)
            if shape_env is not None:
                return sorted(map(str, shape_env.var_to_range))
    return []


def register_dynamo_backend(name: str, compiler_fn) -> None:
    """``torch._dynamo.register_backend`` under ``name``, unless that name is already registered."""
    from torch._dynamo.backends import registry

    if name not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=compiler_fn, name=name)


__all__ += ["aot_autograd", "aot_graph_name", "graph_symbolic_sizes", "register_dynamo_backend"]
INTERNALS.update({
    "AOTAutograd backend": "torch._dynamo.backends.common.aot_autograd",
    "AOT graph name": "torch._functorch._aot_autograd.logging_utils.get_aot_graph_name",
    "symbolic sizes": "torch.fx.experimental.symbolic_shapes.ShapeEnv.var_to_range, node.meta['example_value']",
    "dynamo backend registry": "torch._dynamo.backends.registry._COMPILER_FNS, register_backend",
})
