"""Every private internal trnlab touches still exists in the installed torch, Transformers and
Accelerate: an upgrade that renames one fails here, by name, instead of silently counting zero."""

from __future__ import annotations

import importlib

import pytest
import torch

from trnlab import _compat

#: Every name of trnlab._compat and the private internal it touches; the tests below check each one.
INTERNALS = {
    "COMPILE_TIME_METRIC": "torch._dynamo.utils.compilation_time_metrics key",
    "dynamo_counters": "torch._dynamo.utils.counters",
    "dynamo_unique_graphs": "torch._dynamo.utils.counters['stats']['unique_graphs']",
    "dynamo_recompile_limit_hits": "torch._dynamo.utils.counters['unimplemented'] recompile limit event",
    "dynamo_compile_seconds": "torch._dynamo.utils.compilation_time_metrics",
    "dynamo_reset": "torch._dynamo.reset",
    "dynamo_recompile_limit": "torch._dynamo.config.recompile_limit",
    "dynamo_recompiles_logger": "logging.getLogger('torch._dynamo.guards.__recompiles')",
    "no_compile_caches": "torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache",
    "GENERATE_STATE_ATTRIBUTES": "GenerationMixin's _compiled_call, _last_compile_config, _previous_max_cache_length",
    "forget_generate_state": "GenerationMixin's compile state attributes",
    "generate_cache_length": "GenerationMixin._previous_max_cache_length",
    "compile_on_every_device": "CompileConfig._compile_all_devices",
    "valid_auto_compile_criteria": "GenerationMixin._valid_auto_compile_criteria",
    "attention_implementation": "PretrainedConfig._attn_implementation",
    "ACCELERATE_DYNAMIC_ENV_VAR": "ACCELERATE_DYNAMO_USE_DYNAMIC, read by TorchDynamoPlugin",
    "ACCELERATE_PARALLELISM_REFUSAL": "the words of Accelerate's ParallelismConfig refusal",
    "is_parallelism_refusal": "the words of Accelerate's ParallelismConfig refusal",
    "trainer_dynamo_plugin": "Trainer.accelerator.state.dynamo_plugin",
    "on_trainer_resume": "Trainer._load_from_checkpoint, called by Trainer.train(resume_from_checkpoint=)",
    "cpu_mesh_as_multi_device": "accelerate.Accelerator.multi_device, read by ParallelismConfig._validate_accelerator",
    "model_device_mesh": "PreTrainedModel._device_mesh",
    "strided_shard_class": "torch.distributed.tensor.placement_types._StridedShard",
    "privateuse1_backend_name": "torch._C._get_privateuse1_backend_name",
    "register_device_module": "torch._register_device_module",
    "DEVICE_MODULE_BAD_FORK_HOOK": "torch.random.manual_seed calls <device module>._is_in_bad_fork()",
    "CACHED_DETECTIONS": "the lru_caches of is_torch_neuron_available, is_torch_bf16_gpu_available, is_neuron_available",
    "clear_detection_caches": "those caches' cache_clear, torch.get_device_module.cache_clear",
    "aot_autograd": "torch._dynamo.backends.common.aot_autograd",
    "aot_graph_name": "torch._functorch._aot_autograd.logging_utils.get_aot_graph_name",
    "graph_symbolic_sizes": "ShapeEnv.var_to_range of node.meta['val'] or node.meta['example_value']",
    "register_dynamo_backend": "torch._dynamo.backends.registry._COMPILER_FNS, register_backend",
}


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", [
    "torch._dynamo.utils.counters", "torch._dynamo.utils.compilation_time_metrics", "torch._dynamo.reset",
    "torch._dynamo.config.recompile_limit", "torch._inductor.config.fx_graph_cache",
    "torch._functorch.config.enable_autograd_cache",
    "torch.distributed.tensor.placement_types._StridedShard", "torch._C._get_privateuse1_backend_name",
    "torch._register_device_module", "torch.get_device_module.cache_clear",
    *[f"{module}.{function}.cache_clear" for module, function in _compat.CACHED_DETECTIONS],
    "accelerate.state.PartialState._shared_state", "accelerate.state.AcceleratorState._shared_state",
    "transformers.GenerationMixin._valid_auto_compile_criteria", "transformers.PreTrainedModel._default_compile_config",
])
def test_private_module_attribute_exists(dotted):
    _resolve(dotted)


def test_dynamo_counters_count_a_compiled_graph():
    torch._dynamo.reset()
    before, seconds = _compat.dynamo_unique_graphs(), _compat.dynamo_compile_seconds()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    assert _compat.dynamo_unique_graphs() == before + 1
    assert _compat.dynamo_compile_seconds() > seconds
    from torch._dynamo.utils import compilation_time_metrics

    assert _compat.COMPILE_TIME_METRIC in compilation_time_metrics
    assert _compat.dynamo_recompile_limit_hits() >= 0


def test_recompile_limit_event_name_is_what_dynamo_records():
    torch._dynamo.reset()
    hits = _compat.dynamo_recompile_limit_hits()
    with _compat.dynamo_recompile_limit(1):
        f = torch.compile(lambda x: x.sum(), backend="eager", dynamic=False)
        for n in (2, 3, 4):
            f(torch.ones(n))
    assert _compat.dynamo_recompile_limit_hits() > hits


def test_generate_keeps_the_state_trnlab_forgets():
    from trnlab import load_model

    model = load_model(device="cpu")
    from transformers import CompileConfig

    config = CompileConfig(backend="eager", dynamic=False)
    _compat.compile_on_every_device(config)
    ids = torch.tensor([[5, 6, 7]])
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                   cache_implementation="static", compile_config=config)
    for name in _compat.GENERATE_STATE_ATTRIBUTES:
        assert name in model.__dict__, f"generate() no longer keeps {name}: update trnlab._compat"
    assert _compat.generate_cache_length(model) == 3 + 2 - 1  # max_length - 1: prompt + new tokens - 1
    _compat.forget_generate_state(model)
    assert not any(name in model.__dict__ for name in _compat.GENERATE_STATE_ATTRIBUTES)
    assert _compat.attention_implementation(model) in ("eager", "sdpa")


def test_generate_reads_compile_all_devices():
    import inspect

    from transformers.generation import utils

    assert "_compile_all_devices" in inspect.getsource(utils), "generate() no longer reads _compile_all_devices"


def test_trainer_internals(tmp_path):
    from transformers import Trainer, TrainingArguments

    trainer = Trainer(model=torch.nn.Linear(2, 2), args=TrainingArguments(str(tmp_path), use_cpu=True,
                                                                            report_to="none"))
    assert hasattr(_compat.trainer_dynamo_plugin(trainer), "backend")


def test_trainer_resumes_through_the_method_trnlab_replaces(tmp_path):
    import inspect

    from transformers import Trainer, TrainingArguments

    assert "self._load_from_checkpoint(resume_from_checkpoint)" in inspect.getsource(Trainer.train)
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=TrainingArguments(str(tmp_path), use_cpu=True,
                                                                            report_to="none"))
    called = []
    _compat.on_trainer_resume(trainer, called.append)
    trainer._load_from_checkpoint("checkpoint-7")
    assert called == ["checkpoint-7"]


def test_accelerate_refusal_text_is_still_in_accelerate():
    import inspect

    import accelerate.accelerator

    assert _compat.ACCELERATE_PARALLELISM_REFUSAL in inspect.getsource(accelerate.accelerator)


def test_accelerate_reads_the_dynamic_variable(monkeypatch):
    from accelerate.utils import TorchDynamoPlugin

    monkeypatch.setenv(_compat.ACCELERATE_DYNAMIC_ENV_VAR, "false")
    assert TorchDynamoPlugin().dynamic is False
    monkeypatch.delenv(_compat.ACCELERATE_DYNAMIC_ENV_VAR)
    assert TorchDynamoPlugin().dynamic is None


def test_every_compat_name_is_listed_with_what_it_touches():
    names = {name for name, value in vars(_compat).items() if not name.startswith("_")
             and (isinstance(value, (str, tuple)) or getattr(value, "__module__", None) == _compat.__name__)}
    assert names == set(INTERNALS), (f"add to INTERNALS (and test): {sorted(names - set(INTERNALS))}; "
                                     f"no longer in compat: {sorted(set(INTERNALS) - names)}")


def test_no_other_trnlab_module_reaches_into_private_torch_or_transformers():
    import pathlib
    import re

    package = pathlib.Path(_compat.__file__).parent
    allowed = {"_compat.py"}
    # Code that reaches a private name: an attribute access or an import, not prose in a docstring.
    private = re.compile(r"torch\._(dynamo|C|inductor|functorch)\.\w+\(|\._compile_all_devices\b|"
                         r"\._previous_max_cache_length\b|\._device_mesh\b|import _StridedShard|"
                         r"\.state\.dynamo_plugin\b|"
                         r"torch\._register_device_module\(|\._shared_state\b|\._valid_auto_compile_criteria\(|"
                         r"\._default_compile_config\(|get_device_module\.cache_clear\(|"
                         r"is_(torch_)?neuron_available\.cache_clear\(|is_torch_bf16_gpu_available\.cache_clear\(")
    offenders = [f"{p.relative_to(package)}:{n}" for p in package.rglob("*.py") if p.name not in allowed
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if private.search(line) and "``" not in line and not line.lstrip().startswith("#")]
    assert not offenders, f"move these private touches into trnlab/_compat.py: {offenders}"


def test_cpu_mesh_shim_changes_only_the_multi_device_check_and_restores_it():
    import inspect

    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig

    original = Accelerator.__dict__["multi_device"]
    assert isinstance(original, property), "Accelerator.multi_device is no longer a property: update compat"
    assert "multi_device" in inspect.getsource(ParallelismConfig._validate_accelerator), (
        "Accelerate's ParallelismConfig check no longer reads multi_device: update _compat.cpu_mesh_as_multi_device")
    with _compat.cpu_mesh_as_multi_device():
        assert Accelerator.__dict__["multi_device"] is not original
    assert Accelerator.__dict__["multi_device"] is original


def test_torch_seeds_a_device_module_through_the_hook_the_standin_defines():
    import inspect

    from fake_neuron import FakeNeuronModule
    from trnlab.standin import StandInNeuronModule

    assert f"\"{_compat.DEVICE_MODULE_BAD_FORK_HOOK}\"" in inspect.getsource(torch.random), (
        "torch.manual_seed no longer asks a device module for its bad-fork hook: update compat and trnlab.standin")
    for module in (StandInNeuronModule, FakeNeuronModule):
        assert callable(getattr(module, _compat.DEVICE_MODULE_BAD_FORK_HOOK)), module


def test_device_module_internals_answer_as_the_standin_and_the_fake_expect():
    import accelerate.state  # noqa: F401  (the shared states exist once it is imported)

    from fake_neuron import accelerate_shared_states

    states = accelerate_shared_states()  # the tests' fake device clears them
    assert len(states) == 2 and all(isinstance(state, dict) for state in states)
    _compat.clear_detection_caches()  # every cached detection still has cache_clear()
    assert _compat.privateuse1_backend_name() in ("privateuseone", "neuron")


def test_standin_backend_internals_name_each_aot_graph_and_see_symbolic_sizes():
    from functorch.compile import make_boxed_func

    names, sizes = [], []

    def backend(gm, example_inputs):
        sizes.append(_compat.graph_symbolic_sizes(gm))

        def compile_graph(graph, inputs):
            names.append(_compat.aot_graph_name())
            return make_boxed_func(graph.forward)

        return _compat.aot_autograd(fw_compiler=compile_graph)(gm, example_inputs)

    torch._dynamo.reset()
    weight = torch.ones(3, requires_grad=True)
    torch.compile(lambda x: (x * weight).sum(), backend=backend, dynamic=False)(torch.ones(3)).backward()
    assert [name.rsplit("_", 2)[-2] for name in names] == ["forward", "backward"]
    torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.ones(3, 4))
    assert sizes[0] == [] and len(sizes[1]) == 2


def test_register_dynamo_backend_registers_a_name_once():
    from torch._dynamo.backends.registry import lookup_backend

    def first(gm, example_inputs):
        return gm.forward

    _compat.register_dynamo_backend("trnlab_compat_test", first)
    _compat.register_dynamo_backend("trnlab_compat_test", lambda gm, example_inputs: gm.forward)
    assert lookup_backend("trnlab_compat_test") is first
