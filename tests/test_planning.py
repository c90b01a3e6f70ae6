"""trnlab.planning: the bytes it predicts are the bytes ranks really hold; meshes and errors make sense.

The measured-vs-predicted checks on 4 real ranks (``trnlab/scripts/measure_memory.py``, tp 2 x
fsdp 2) live in tests/test_distributed.py, whose one sharded run also measures: parameter bytes
per rank equal, parameters + gradients + AdamW state within 5%. The static KV cache and the
per-layer activation formula are checked in this process; everything else is arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trnlab
from trnlab import planning
from trnlab.launcher import LaunchConfigError, validate_parallel_sizes
from trnlab.planning import GiB, PlanError, plan_memory, plan_mesh

SCRIPT = Path(planning.__file__).parent / "scripts" / "measure_memory.py"
BATCH, SEQ = 2, 32  # micro-batch per FSDP rank in the measured run

#: Model cards (huggingface.co/Qwen/<name>): total and non-embedding parameters, in billions.
MODEL_CARDS = {"Qwen/Qwen3-0.6B": (0.6, 0.44), "Qwen/Qwen3-1.7B": (1.7, 1.4), "Qwen/Qwen3-4B": (4.0, 3.6),
               "Qwen/Qwen3-8B": (8.2, 6.95), "Qwen/Qwen3-14B": (14.8, 13.2), "Qwen/Qwen3-32B": (32.8, 31.2)}


# ------------------------------------------------------------------ shipped configs


@pytest.mark.parametrize("name", list(planning.SHIPPED_MODELS))
def test_shipped_config_counts_equal_the_meta_model_and_the_model_card(name):
    from transformers import AutoModelForCausalLM

    config, label = planning.resolve_config(name)
    assert label == name and config.model_type == "qwen3" and config.vocab_size == 151936
    assert config.max_position_embeddings == 40960 and config.head_dim == 128
    assert config.tie_word_embeddings == (name in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    plan = plan_memory(name)
    assert plan.parameter_count == sum(p.numel() for p in model.parameters())
    assert plan.local_parameter_count == plan.parameter_count  # one rank holds it all
    embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    total, non_embedding = MODEL_CARDS[name]
    digits = len(str(non_embedding).split(".")[1])   # as precise as the card gives it
    assert round(plan.parameter_count / 1e9, 1) == total
    assert round((plan.parameter_count - embeddings) / 1e9, digits) == non_embedding


def test_shards_follow_the_tp_plan_then_fsdp_on_dim_0():
    shards = {s.name: s for s in planning.parameter_shards("Qwen/Qwen3-8B", tp_size=4, fsdp_size=16)}
    layer = "model.layers.7."
    assert shards[layer + "self_attn.q_proj.weight"].local_shape == (4096 // 4 // 16, 4096)   # colwise
    assert shards[layer + "self_attn.k_proj.weight"].local_shape == (1024 // 4 // 16, 4096)
    assert shards[layer + "self_attn.o_proj.weight"].local_shape == (4096 // 16, 4096 // 4)   # rowwise
    assert shards[layer + "mlp.down_proj.weight"].local_shape == (4096 // 16, 12288 // 4)
    assert shards["model.embed_tokens.weight"].local_shape == (151936 // 4 // 16, 4096)        # vocab rows
    assert shards["lm_head.weight"].tp_style == "colwise_gather_output"
    norms = [s for s in shards.values() if "norm" in s.name]
    assert len(norms) == 36 * 4 + 1 and all(s.tp_shape == s.shape for s in norms)             # replicated
    assert shards[layer + "self_attn.q_norm.weight"].local_shape == (128 // 16,)
    # Uneven sizes: ceil at each step, the FSDP2 padding counted (761 vocab rows, 2 x 2 mesh).
    tiny = {s.name: s for s in planning.parameter_shards(None, tp_size=2, fsdp_size=2)}
    assert tiny["model.embed_tokens.weight"].tp_shape == (381, 192)
    assert tiny["model.embed_tokens.weight"].local_shape == (191, 192)
    assert "lm_head.weight" not in tiny  # tied: counted once


def test_memory_components_scale_as_documented():
    infer = plan_memory("Qwen/Qwen3-8B", 4, 1, batch=2, seq=1024)
    d = {"layers": 36, "kv_heads": 8, "head_dim": 128}
    assert infer.components["kv_cache"] == 2 * 1024 * d["layers"] * (d["kv_heads"] // 4) * d["head_dim"] * 2 * 2
    assert infer.components["gradients"] == infer.components["optimizer"] == infer.components["fsdp_buffers"] == 0
    assert infer.components["parameters"] == infer.local_parameter_count * 2                      # bf16
    train = plan_memory("Qwen/Qwen3-8B", 4, 16, workload="train", batch=1, seq=4096)
    n = train.local_parameter_count
    assert train.components["parameters"] == train.components["gradients"] == 4 * n               # fp32 master
    assert train.components["optimizer"] == 2 * 4 * n + 4 * len(train.shards)                     # moments + step
    assert train.training_state == 16 * n + 4 * len(train.shards)
    bf16 = plan_memory("Qwen/Qwen3-8B", 4, 16, workload="train", batch=1, seq=4096, master_weights="bf16")
    assert bf16.components["optimizer"] == 2 * 2 * n + 4 * len(bf16.shards)                       # zeros_like(bf16)
    checkpointed = plan_memory("Qwen/Qwen3-8B", 4, 16, workload="train", batch=1, seq=4096,
                               gradient_checkpointing=True)
    assert checkpointed.components["activations"] < train.components["activations"] / 2
    twice = plan_memory("Qwen/Qwen3-8B", 4, 16, workload="train", batch=2, seq=4096)
    assert twice.components["activations"] == pytest.approx(2 * train.components["activations"], rel=1e-6)
    assert twice.training_state == train.training_state   # the batch changes activations only
    assert "FSDP is data parallelism" in " ".join(train.notes)
    assert json.loads(json.dumps(train.to_dict()))["total_bytes"] == train.total
    assert "total per rank" in train.table() and "Qwen/Qwen3-8B on tp=4 x fsdp=16" in train.summary()


# ------------------------------------------------------------------ instances and meshes


def test_instances_come_from_the_neuron_docs():
    trn2 = planning.get_instance("trn2.48xlarge")
    assert (trn2.logical_cores, trn2.hbm_per_core, trn2.hbm_total) == (64, 24 * GiB, 1536 * GiB)
    small = planning.get_instance("trn2.3xlarge")
    assert (small.logical_cores, small.hbm_per_core) == (4, 24 * GiB)
    assert planning.get_instance("trn2u.48xlarge").logical_cores == 64
    gen1 = planning.get_instance("trn3-gen1-ultraserver")
    assert (gen1.logical_cores, gen1.cores_per_host, gen1.hbm_per_core) == (256, 64, 36 * GiB)
    assert all(inst.source.startswith("https://awsdocs-neuron") for inst in planning.INSTANCES.values())


def test_recommended_meshes_for_qwen3_8b_on_a_trn2():
    train = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096)
    best = train.recommended
    assert (best.tp_size, best.fsdp_size) == (8, 8)
    assert best.fits and best.plan.total <= train.budget
    assert not any(c.fits for c in train.candidates if c.tp_size < 8)
    assert "smallest tensor-parallel size that fits (tp=4 needs" in train.reason
    assert "tp=8 spans 2 chips" in train.reason
    # Gradient checkpointing frees the layers' activations: no TP needed, every rank does FSDP.
    checkpointed = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096,
                             gradient_checkpointing=True)
    assert (checkpointed.recommended.tp_size, checkpointed.recommended.fsdp_size) == (1, 64)
    rejected = {c.tp_size: c.rejected for c in train.candidates if not c.valid}
    assert set(rejected) == {16, 32, 64} and "key/value heads = 8" in rejected[16]
    infer = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "inference", batch=1, seq=4096)
    assert (infer.recommended.tp_size, infer.recommended.fsdp_size) == (1, 64)
    assert "independent replicas" in infer.reason
    small = plan_mesh("Qwen/Qwen3-4B", "trn2.3xlarge", "train", batch=1, seq=2048, gradient_checkpointing=True)
    assert small.recommended.tp_size * small.recommended.fsdp_size == 4
    text = planning.format_plan(train)
    assert "<- recommended" in text and "note: activations (estimate)" in text


def test_plot_memory_plan_draws_one_stacked_bar_per_mesh():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mesh_plan = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096)
    fig = planning.plot_memory_plan(mesh_plan)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(mesh_plan.plans)
    heights = {}
    for patch in ax.patches:
        heights[patch.get_x()] = heights.get(patch.get_x(), 0) + patch.get_height()
    assert sorted(heights.values()) == pytest.approx(sorted(p.total / GiB for p in mesh_plan.plans.values()))
    plt.close(fig)


# ------------------------------------------------------------------ bad input


def test_unknown_and_trn1_instances_are_refused_with_the_reason():
    with pytest.raises(PlanError, match="unknown instance 'trn9.huge': use one of trn2.3xlarge, trn2.48xlarge"):
        planning.get_instance("trn9.huge")
    with pytest.raises(PlanError, match="XLA-based torch-neuronx") as info:
        plan_mesh("Qwen/Qwen3-8B", "trn1.32xlarge")
    assert "trn2 and trn3 only" in str(info.value)
    assert issubclass(PlanError, ValueError)


def test_a_mesh_that_does_not_divide_gives_the_launch_message():
    def launch_message(*args, **kwargs):
        with pytest.raises(LaunchConfigError) as info:
            validate_parallel_sizes(*args, **kwargs)
        return str(info.value)

    config, _ = planning.resolve_config("Qwen/Qwen3-8B")
    with pytest.raises(PlanError) as info:
        plan_mesh(config, "trn2.48xlarge", tp_size=16, fsdp_size=4)
    assert str(info.value) == launch_message(64, 16, 4, model_config=config)
    assert "key/value heads = 8" in str(info.value)
    with pytest.raises(PlanError) as info:
        plan_mesh(config, "trn2.48xlarge", tp_size=2, fsdp_size=2)
    assert str(info.value) == launch_message(64, 2, 2, model_config=config)
    # The course model's 761-row tied vocabulary does not split over 4 ranks: the same message.
    with pytest.raises(PlanError, match="pad_vocabulary"):
        plan_mesh(None, "trn2.3xlarge", tp_size=2, fsdp_size=2)


def test_a_config_without_the_needed_fields_names_them(tmp_path):
    with pytest.raises(PlanError, match="lacks intermediate_size, num_hidden_layers, num_attention_heads, "
                                        "num_key_value_heads, vocab_size"):
        plan_memory({"model_type": "qwen3", "hidden_size": 64})
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "vocab_size": 100}))
    with pytest.raises(PlanError, match=r"config.json lacks model_type"):
        planning.resolve_config(tmp_path)
    with pytest.raises(PlanError, match="workload='serve'"):
        plan_memory("Qwen/Qwen3-0.6B", workload="serve")
    with pytest.raises(PlanError, match="master_weights='fp8'"):
        plan_memory("Qwen/Qwen3-0.6B", workload="train", master_weights="fp8")


def test_a_workload_that_fits_no_mesh_says_what_would():
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.3xlarge", "train", batch=2, seq=4096)
    message = str(info.value)
    assert message.startswith("Qwen/Qwen3-8B training (micro-batch 2 x 4096 per rank) fits no mesh on "
                              "trn2.3xlarge")
    assert "21.6 GiB usable" in message and "What would fit:" in message
    assert "--nodes" in message and "one trn2.48xlarge" in message and "--gradient-checkpointing" in message
    # Each alternative was planned: the one on a trn2.48xlarge really fits.
    assert plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096,
                     gradient_checkpointing=True).recommended.fits


# ------------------------------------------------------------------ command line


def test_cli_json_for_a_shipped_model_works_offline(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from trnlab.__main__ import main as trnlab_main

    assert trnlab_main(["plan", "--model", "Qwen/Qwen3-8B", "--instance", "trn2.48xlarge", "--train",
                        "--seq", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Qwen/Qwen3-8B" and out["world_size"] == 64
    assert (out["recommended"]["tp_size"], out["recommended"]["fsdp_size"]) == (8, 8)
    assert out["recommended"]["plan"]["total_bytes"] <= out["budget_bytes"]


def test_cli_reads_a_config_file_and_trnlab_model(capsys, monkeypatch, tmp_path):
    config = json.loads(planning.SHIPPED_MODELS["Qwen/Qwen3-0.6B"].read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("TRNLAB_MODEL", str(tmp_path))
    assert planning.main(["--instance", "trn2.3xlarge", "--tp", "2", "--fsdp", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{tmp_path}, inference on trn2.3xlarge: 4 logical NeuronCores")
    assert "<- recommended" in text
    assert planning.main(["--model", "Qwen3-8B", "--instance", "trn1.32xlarge"]) == 2
    assert "XLA-based torch-neuronx" in capsys.readouterr().err


# ------------------------------------------------------------------ measured in this process


def test_kv_cache_estimate_equals_the_static_cache_generate_allocates(one_torch_thread):
    model = trnlab.load_model(None, device="cpu", dtype=torch.float32)
    tokenizer = trnlab.load_tokenizer()
    inputs = tokenizer([trnlab.EXAMPLE_PROMPT] * 3, return_tensors="pt")
    new = 4
    out = model.generate(**inputs, do_sample=False, max_new_tokens=new, cache_implementation="static",
                         return_dict_in_generate=True)
    cache = out.past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    prompt = inputs["input_ids"].shape[1]
    plan = plan_memory(None, workload="inference", batch=3, seq=prompt + new, dtype="float32",
                       cache_length=prompt + new - 1)   # generate sizes the cache max_length - 1
    assert plan.components["kv_cache"] == measured


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_layer_activation_formula_equals_the_saved_tensors(dtype, one_torch_thread):
    model = trnlab.load_model(None, device="cpu", dtype=dtype).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved, where = {}, ["before"]
    model.model.layers[1].register_forward_pre_hook(lambda *a: where.__setitem__(0, "layer 1"))
    model.model.layers[1].register_forward_hook(lambda *a: where.__setitem__(0, "after"))

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved.setdefault(storage.data_ptr(), (where[0], storage.nbytes()))
        return tensor

    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids)
    layer_bytes = sum(n for w, n in saved.values() if w == "layer 1")
    plan = plan_memory(None, workload="train", batch=BATCH, seq=SEQ, dtype=str(dtype).split(".")[1])
    assert plan.activation_detail["per_layer"] == layer_bytes
