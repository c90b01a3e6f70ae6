"""trnlab.simulate: the simulated Neuron device, and the real libraries' decisions inside it."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

import trnlab
from trnlab import device as dev
from trnlab import simulate as sim


def _transformers_sees_neuron() -> bool:
    from transformers.utils.import_utils import is_torch_neuron_available

    return is_torch_neuron_available()


def _accelerate_sees_neuron() -> bool:
    from accelerate.utils.imports import is_neuron_available

    return is_neuron_available()


def _nothing_left_behind():
    assert dev.detect_backend() in ("cpu", "cuda") and not dev.backend_available("neuron")
    assert not _transformers_sees_neuron() and not _accelerate_sees_neuron()
    assert not sim.simulation_active()
    assert not torch.accelerator.is_available() or torch.accelerator.current_accelerator().type == "cuda"
    assert "torch_neuronx" not in sys.modules or sys.modules["torch_neuronx"] is None \
        or not getattr(sys.modules["torch_neuronx"], "simulated", False)
    neuron = getattr(torch, "neuron", None)
    if neuron is not None:  # the backend rename cannot be undone: a module without devices stays
        assert neuron.device_count() == 0 and not neuron.is_available()
        assert sys.modules["torch.neuron"] is neuron
        assert "no device" in repr(neuron)


def test_simulation_is_seen_by_trnlab_transformers_and_accelerate_and_then_gone(capsys):
    cuda_available = torch.cuda.is_available
    with sim.simulate_neuron(cores=4) as module:
        assert capsys.readouterr().out.strip() == sim.SIMULATION_NOTICE.format(cores=4)
        assert torch.neuron is module and sys.modules["torch.neuron"] is module
        assert module.simulated and "SIMULATED" in repr(module) and "no Trainium" in repr(module)
        assert sys.modules["torch_neuronx"].simulated and "+simulated" in sys.modules["torch_neuronx"].__version__
        assert (torch.neuron.is_available(), torch.neuron.device_count()) == (True, 4)
        assert torch.device("neuron", 3).type == "neuron"
        assert torch.accelerator.current_accelerator().type == "neuron" and torch.accelerator.device_count() == 4
        assert not torch.cuda.is_available() and torch.cuda.device_count() == 0  # a trn2 has no GPU
        assert dev.detect_backend() == "neuron" and trnlab.pick_device(verbose=False) == torch.device("neuron", 0)
        assert _transformers_sees_neuron() and _accelerate_sees_neuron()
        assert sim.simulation_active()
    assert torch.cuda.is_available is cuda_available
    _nothing_left_behind()


def test_torch_accelerator_follows_each_simulation():
    with sim.simulate_neuron(cores=4, notice=False):
        assert torch.accelerator.is_available() and torch.accelerator.device_count() == 4
    with sim.simulate_neuron(cores=2, notice=False) as module:
        assert torch.accelerator.device_count() == 2
        module.cores = 0
        assert not torch.accelerator.is_available() and dev.detect_backend() != "neuron"
    assert torch.accelerator.device_count() == 0 or torch.accelerator.current_accelerator().type == "cuda"


def test_no_tensor_can_live_on_the_simulated_device():
    with sim.simulate_neuron(notice=False):
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.zeros(1, device="neuron")


def test_accelerate_picks_neuron_inside_and_its_earlier_state_comes_back():
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    PartialState._reset_state()
    before = PartialState()
    assert before.device.type in ("cpu", "cuda")
    with sim.simulate_neuron(notice=False):
        state = PartialState()
        assert state.device == torch.device("neuron") and state.distributed_type == DistributedType.NO
    assert PartialState().device == before.device


def test_nested_simulations_and_cores():
    with sim.simulate_neuron(cores=64, notice=False) as outer:
        assert torch.neuron.device_count() == 64
        with sim.simulate_neuron(cores=2, bf16=False, notice=False):
            assert torch.neuron.device_count() == 2 and not torch.neuron.is_bf16_supported()
            assert not dev.bf16_supported("neuron")
        assert torch.neuron is outer and dev.device_count("neuron") == 64
        outer.cores = 0
        assert dev.detect_backend() != "neuron"
    _nothing_left_behind()


def test_module_answers_only_decision_questions():
    module = sim.SimulatedNeuronModule(cores=4)
    module.set_device(torch.device("neuron", 2))
    assert module.current_device() == 2 and "SIMULATED" in module.get_device_name()
    with pytest.raises(RuntimeError, match="does not exist"):
        module.set_device(4)
    for measuring in ("memory_allocated", "synchronize", "get_dynamo_metrics", "mem_get_info"):
        assert not hasattr(module, measuring)
    with pytest.raises(ValueError):
        sim.SimulatedNeuronModule(cores=-1)


def test_exit_restores_after_an_error():
    with pytest.raises(KeyError):
        with sim.simulate_neuron(notice=False):
            raise KeyError("boom")
    _nothing_left_behind()


# ------------------------------------------------------------------ the claims, by the real libraries


def test_claim_1_device_module():
    decision = sim.claim_neuron_device()
    assert str(decision) == ("SIMULATED claim 1: print(torch.neuron.is_available(), torch.neuron.device_count()) "
                             "-> prints 'True 4' (the 4 cores are the simulation's input, not detected); "
                             "torch.accelerator.current_accelerator() -> neuron, device_count() -> 4; "
                             "trnlab.pick_device() -> neuron:0")
    assert decision.values == {"printed": "True 4", "cores_given": 4, "accelerator": "neuron",
                               "accelerator_count": 4, "pick_device": "neuron:0"}
    # The printed line follows the simulated machine: a trn2.48xlarge shows 64, no core shows False 0.
    assert sim.claim_neuron_device(64).values["printed"] == "True 64"
    empty = sim.claim_neuron_device(0).values
    assert (empty["printed"], empty["pick_device"]) == ("False 0", "cpu")
    _nothing_left_behind()


def test_claim_3_device_map_auto_lands_on_cpu_and_trnlab_fixes_it():
    decision = sim.claim_device_map_auto()
    assert str(decision) == ('SIMULATED claim 3: from_pretrained(device_map="auto").device; '
                             "trnlab.resolve_device_map(\"auto\") -> cpu; 'neuron' "
                             "(warns: device_map='auto' does not see Neuron)")
    assert decision.values["auto_lands_on"] == "cpu" and decision.values["resolve_device_map"] == "neuron"
    assert decision.values["warning"] == dev.AUTO_ON_NEURON_WARNING
    _nothing_left_behind()


def test_claim_6_generate_auto_compiles_on_neuron_with_a_static_cache():
    decision = sim.claim_generate_auto_compile()
    assert decision.values == {"cpu": False, "neuron": True, "neuron_dynamic_cache": False,
                               "neuron_disable_compile": False,
                               "compile_config": {"backend": "neuron", "dynamic": False, "mode": "default"}}
    assert str(decision) == ("SIMULATED claim 6: generate auto-compiles with cache_implementation='static' -> "
                             "neuron True (cpu False; neuron with DynamicCache False; disable_compile=True False); "
                             "CompileConfig(backend='neuron', dynamic=False, mode='default')")
    _nothing_left_behind()


def test_reporting_device_changes_only_what_device_reports():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trnlab.assets.BUNDLED_MODEL_DIR)
    cls = type(model)
    with sim.ReportingDevice(model, "neuron:0") as same:
        assert same is model and model.device == torch.device("neuron", 0) and model.simulated
        assert next(model.parameters()).device.type == "cpu" and isinstance(model, cls)
    assert type(model) is cls and model.device.type == "cpu"


def test_reporting_device_is_a_deprecated_alias_of_reporting_device_class():
    model = torch.nn.Linear(2, 2)
    with pytest.warns(FutureWarning, match=r"reporting_device is deprecated.*write trnlab.simulate.ReportingDevice"):
        context = sim.reporting_device(model, "neuron:0")
    assert isinstance(context, sim.ReportingDevice)
    with context as same:
        assert same.device == torch.device("neuron", 0)
    assert type(model) is torch.nn.Linear


def test_claim_7_training_arguments_choose_neuron_and_leave_bf16_off():
    decision = sim.claim_training_device()
    assert str(decision) == ("SIMULATED claim 7: TrainingArguments(output_dir).device, .bf16 -> "
                             "neuron:0, bf16=False (bf16=True accepted: True)")
    assert decision.values["device"] == "neuron:0" and decision.values["bf16"] is False
    _nothing_left_behind()


def test_claim_8_torch_compile_backend_is_neuron():
    decision = sim.claim_torch_compile_backend()
    assert str(decision) == ("SIMULATED claim 8: TrainingArguments(torch_compile=True).torch_compile_backend "
                             "-> 'neuron'")
    _nothing_left_behind()
    from transformers import TrainingArguments

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outside = TrainingArguments(output_dir="unused", report_to="none", torch_compile=True, use_cpu=True)
    assert outside.torch_compile_backend == "inductor"  # the real library again, off Trainium


def test_decisions_in_a_subprocess_leave_this_process_untouched():
    # Claim 1 only: notebook 01's checked cell runs all five this way (in both dtypes), and each
    # claim is checked in this process above.
    decisions = sim.simulated_decisions([1])
    assert sorted(decisions) == [1]
    assert decisions[1] == sim.claim_neuron_device()  # the same text in both processes
    _nothing_left_behind()
    with pytest.raises(ValueError, match=r"claim\(s\) \[2\]"):
        sim.simulated_decisions([2])
