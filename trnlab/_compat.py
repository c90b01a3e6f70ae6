"""Every touch of a library's private internals, each a named function or constant; no other trnlab module reaches in.
``tests/test_compat.py`` checks each in the installed libraries: a rename fails there, not as zero graphs counted.
Private to trnlab; a rank script's two (the CPU mesh workaround) are public as ``trnlab.distributed``'s."""

from __future__ import annotations

import contextlib
import logging
import sys

import torch

# torch._dynamo: graph counts, compile time, recompile limit, reset

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
    """Times dynamo gave up on a function because it recompiled too often (its "recompile limit exceeded" event)."""
    unimplemented = dynamo_counters()["unimplemented"]
    return int(sum(n for key, n in unimplemented.items() if key.startswith("Dynamo recompile limit exceeded")))


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


def dynamo_recompiles_logger():
    """The ``logging.Logger`` of dynamo's ``recompiles`` artifact (what ``TORCH_LOGS=recompiles`` prints)."""
    import torch._dynamo.guards  # noqa: F401  (creates the artifact logger)

    return logging.getLogger("torch._dynamo.guards.__recompiles")


def no_compile_caches():
    """A context manager that turns off inductor's FX graph cache and the AOTAutograd cache: every graph compiles."""
    import torch._functorch.config
    import torch._inductor.config

    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


# transformers generate(): compile state kept on the model, compile on every device

#: Attributes ``generate()`` caches on a model: the compiled forward, its config, the largest static-cache length.
GENERATE_STATE_ATTRIBUTES = ("_compiled_call", "_last_compile_config", "_previous_max_cache_length")


def forget_generate_state(model) -> None:
    """Drop the compiled forward and cache length ``generate()`` keeps on ``model``."""
    for name in GENERATE_STATE_ATTRIBUTES:
        model.__dict__.pop(name, None)


def generate_cache_length(model) -> int | None:
    """The static-cache length ``generate()`` last used on ``model`` (``None`` before any)."""
    return getattr(model, "_previous_max_cache_length", None)


def compile_on_every_device(config) -> None:
    """Let ``generate()`` auto-compile ``config`` on any device, CPU included (``_compile_all_devices``).
    ``_valid_auto_compile_criteria`` compiles only on cuda/xpu/neuron/tpu without it; it is not a dataclass field."""
    config._compile_all_devices = True


def valid_auto_compile_criteria(model, model_kwargs: dict, generation_config) -> bool:
    """``GenerationMixin._valid_auto_compile_criteria``: whether generate() will compile the forward."""
    return bool(model._valid_auto_compile_criteria(model_kwargs, generation_config))


def attention_implementation(model) -> str | None:
    """``model.config._attn_implementation`` ("eager", "sdpa", ...)."""
    return getattr(model.config, "_attn_implementation", None)


# Trainer and Accelerate

#: Accelerate reads this when the Trainer builds its TorchDynamoPlugin with ``dynamic`` unset.
ACCELERATE_DYNAMIC_ENV_VAR = "ACCELERATE_DYNAMO_USE_DYNAMIC"
#: Words of Accelerate's refusal of a load-time-sharded model on a device type it does not accept.
ACCELERATE_PARALLELISM_REFUSAL = "ParallelismConfig"


def is_parallelism_refusal(error: BaseException) -> bool:
    """Whether ``error`` is Accelerate refusing a sharded model on this device type (MULTI_CPU)."""
    return isinstance(error, ValueError) and ACCELERATE_PARALLELISM_REFUSAL in str(error)


def on_trainer_resume(trainer, hook) -> None:
    """Make ``trainer.train(resume_from_checkpoint=path)`` call ``hook(path)`` where it loads the weights
    (``Trainer._load_from_checkpoint``), which fails for a model sharded at load time ("mixed Tensor and DTensor")."""
    trainer._load_from_checkpoint = lambda path, model=None: hook(path)


def trainer_dynamo_plugin(trainer):
    """The ``TorchDynamoPlugin`` the Trainer's Accelerator compiles with."""
    return trainer.accelerator.state.dynamo_plugin


@contextlib.contextmanager
def cpu_mesh_as_multi_device():
    """Let Accelerate take a model sharded at load time on a gloo CPU mesh, as it does on Trainium (MULTI_NEURON).
    Accelerate takes a ``ParallelismConfig`` only if ``Accelerator.multi_device``, which leaves out MULTI_CPU: in the
    block it is true for a distributed MULTI_CPU run too, class-wide. Build the ``Trainer`` inside, train outside."""
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


# torch.distributed: the model's mesh, strided shards

def model_device_mesh(model):
    """The (pp, fsdp, tp) device mesh Transformers keeps on a sharded model (``_device_mesh``)."""
    return getattr(model, "_device_mesh", None)


def strided_shard_class():
    """``torch.distributed.tensor.placement_types._StridedShard`` (FSDP sharding a TP-split dim)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard


# A neuron device module (trnlab.standin, the tests' fake): registering it, the caches that remember Neuron

def privateuse1_backend_name() -> str:
    """The name of PyTorch's out-of-tree device backend ("privateuseone", or "neuron" once renamed)."""
    return torch._C._get_privateuse1_backend_name()


def register_device_module(name: str, module) -> None:
    """``torch._register_device_module``: how out-of-tree backends install ``torch.<name>``."""
    torch._register_device_module(name, module)


#: The method ``torch.manual_seed`` calls on every registered device module before seeding it (``_bad_fork_name``).
DEVICE_MODULE_BAD_FORK_HOOK = "_is_in_bad_fork"

#: lru_cache'd library functions whose answer depends on ``torch.neuron`` / CUDA: (module, name).
CACHED_DETECTIONS = (
    ("transformers.utils.import_utils", "is_torch_neuron_available"),
    ("transformers.utils.import_utils", "is_torch_bf16_gpu_available"),
    ("accelerate.utils.imports", "is_neuron_available"),
)


def clear_detection_caches() -> None:
    """Forget the cached Neuron/bf16 answers of :data:`CACHED_DETECTIONS` (modules not imported yet cache nothing)
    and ``torch.get_device_module``'s cache, through which ``torch.accelerator`` reaches ``torch.neuron``."""
    torch.get_device_module.cache_clear()
    for module_name, function_name in CACHED_DETECTIONS:
        module = sys.modules.get(module_name)
        if module is not None:
            getattr(module, function_name).cache_clear()


# The stand-in neuron device's dynamo backend, built as TorchNeuron's is

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
    TorchNeuron's DynamicShapeAnalysis reads them from ``meta["val"]``; dynamo 2.13 writes ``meta["example_value"]``."""
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
