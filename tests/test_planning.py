"""trnlab.planning: the bytes it predicts are the bytes ranks really hold; meshes and errors make sense.

The measured-vs-predicted checks on 4 real ranks (``tests/scripts/measure_memory.py``, tp 2 x
fsdp 2) live in tests/test_distributed.py, whose one sharded run also measures: parameter bytes
per rank equal, parameters + gradients + AdamW state within 5%. The static KV cache and the
per-layer activation formula are checked in this process; everything else is arithmetic.
"""

from __future__ import annotations

import json

import pytest
import torch

import trnlab
from trnlab import models, planning
from trnlab.__main__ import _plan as plan_main
from trnlab.launcher import GiB, INSTANCES, get_instance, validate_parallel_sizes
from trnlab.planning import plan_memory, plan_mesh
from trnlab.settings import PlanError, SettingError

BATCH, SEQ = 2, 32  # micro-batch per FSDP rank in the measured run

#: Model cards (huggingface.co/Qwen/<name>): total and non-embedding parameters, in billions.
MODEL_CARDS = {"Qwen/Qwen3-0.6B": (0.6, 0.44), "Qwen/Qwen3-1.7B": (1.7, 1.4), "Qwen/Qwen3-4B": (4.0, 3.6),
               "Qwen/Qwen3-8B": (8.2, 6.95), "Qwen/Qwen3-14B": (14.8, 13.2), "Qwen/Qwen3-32B": (32.8, 31.2)}


# ------------------------------------------------------------------ shipped configs


@pytest.mark.parametrize("name", list(models.SHIPPED_MODELS))
def test_shipped_config_counts_equal_the_meta_model_and_the_model_card(name):
    from transformers import AutoModelForCausalLM

    config = models.load_config(name, required=True)
    assert config.name_or_path == name and config.model_type == "qwen3" and config.vocab_size == 151936
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
    shards = {s.name: s for s in plan_memory("Qwen/Qwen3-8B", 4, 16).shards}
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
    tiny = {s.name: s for s in plan_memory(None, 2, 2).shards}
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
    assert json.loads(json.dumps(train.summary(shards=True)))["total_bytes"] == train.total
    assert "total per rank" in str(train) and "Qwen/Qwen3-8B on tp=4 x fsdp=16" in planning.format_plan(train)


# ------------------------------------------------------------------ instances and meshes


def test_instances_come_from_the_neuron_docs():
    trn2 = get_instance("trn2.48xlarge")
    assert (trn2.logical_cores, trn2.hbm_per_core, trn2.hbm_total) == (64, 24 * GiB, 1536 * GiB)
    small = get_instance("trn2.3xlarge")
    assert (small.logical_cores, small.hbm_per_core) == (4, 24 * GiB)
    assert get_instance("trn2u.48xlarge").logical_cores == 64
    gen1 = get_instance("trn3-gen1-ultraserver")
    assert (gen1.logical_cores, gen1.cores_per_host, gen1.hbm_per_core) == (256, 64, 36 * GiB)
    assert all(inst.source.startswith("https://awsdocs-neuron") for inst in INSTANCES.values())


def test_recommended_meshes_for_qwen3_8b_on_a_trn2_follow_neuron_practice():
    train = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096)
    best = train.recommended
    # AWS's TorchTitan recipe: tp4 x fsdp16 with selective activation checkpointing.
    assert (best.tp_size, best.fsdp_size, train.checkpointing) == (4, 16, "selective")
    assert best.fits and best.plan.total <= train.budget and best.plan.checkpointing == "selective"
    assert [(t["tp_size"], t["fsdp_size"], t["checkpointing"], t["fits"]) for t in train.tried] == [
        (1, 64, "none", False), (4, 16, "none", False), (1, 64, "selective", False), (4, 16, "selective", True)]
    # The headline: the layout, its bytes against the budget, the headroom said as the planner's assumption.
    headline, why = train.reason.split("\n")
    assert headline == (f"Recommended: tp=4 x fsdp=16 with selective activation checkpointing (every 2nd layer), "
                        f"{best.plan.total / GiB:.2f} of 21.6 GiB usable per core (24 GiB of HBM minus the planner's "
                        "assumed 10% headroom; the runtime's own overhead is not published).")
    assert '"Keep TP4 within a chip"' in why and "spans" not in why
    assert ("It is the mesh of AWS's published layout for Qwen/Qwen3-8B on a trn2.48xlarge" in why
            and "by construction" in why and "not an independent confirmation" in why)
    assert "qwen3_8b_tp4_fsdp16_sac" in train.reason and "18 of 36 layers" in train.reason
    # tp=2 fits too (the table shows it); the reason says why the ladder passes over it.
    tp2 = next(c for c in train.candidates if c.tp_size == 2)
    assert tp2.fits and tp2.plan.total < train.budget
    assert (f"tp=2 x fsdp=32 ({tp2.plan.total / GiB:.2f} GiB) would fit too, but the planner passes "
            "over TP smaller than a chip") in train.reason
    assert "'every 2nd layer' is the planner's assumption" in train.reason
    assert not any(c.fits for c in train.candidates if c.tp_size == 1)
    rejected = {c.tp_size: c.rejected for c in train.candidates if not c.valid}
    assert set(rejected) == {16, 32, 64} and "key/value heads = 8" in rejected[16]
    # Without checkpointing nothing inside a chip fits: tp=8 is the last resort, and it says so.
    none = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096, gradient_checkpointing="none")
    assert (none.recommended.tp_size, none.recommended.fsdp_size) == (8, 8)
    assert none.reason.startswith("Recommended: tp=8 x fsdp=8, ")   # no checkpointing: none said
    assert ("tp=8 spans 2 chips, against Neuron's \"Keep TP4 within a chip\": no mesh with TP inside a chip fits."
            in none.reason) and "by construction" not in none.reason
    # Full checkpointing frees the layers' activations: FSDP alone fits, every rank does FSDP.
    full = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=4096, gradient_checkpointing=True)
    assert (full.recommended.tp_size, full.recommended.fsdp_size, full.checkpointing) == (1, 64, "full")
    assert "FSDP alone fits: no tensor parallelism" in full.reason and "36 of 36 layers" in full.reason
    # A shorter sequence fits tp4 without recompute: AWS's mesh, not its layout, so no "by construction".
    short = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=2048)
    assert (short.recommended.tp_size, short.recommended.fsdp_size, short.checkpointing) == (4, 16, "none")
    assert "by construction" not in short.reason and "Checkpointing" not in short.reason
    small = plan_mesh("Qwen/Qwen3-4B", "trn2.3xlarge", "train", batch=1, seq=2048, gradient_checkpointing=True)
    assert small.recommended.tp_size * small.recommended.fsdp_size == 4
    text = planning.format_plan(train)
    assert "<- recommended" in text and "note: activations (estimate)" in text and "selective checkpointing" in text


def test_serving_recommends_replicas_without_fsdp():
    one = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "inference", batch=1, seq=4096)
    assert (one.recommended.tp_size, one.recommended.fsdp_size, one.recommended.replicas) == (1, 1, 64)
    eight = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "inference", batch=8, seq=4096)
    best = eight.recommended
    assert (best.tp_size, best.fsdp_size, best.replicas) == (2, 1, 32)
    assert eight.reason.startswith(f"Recommended for serving: 32 replicas of tp=2, {best.plan.total / GiB:.2f} of "
                                   "21.6 GiB usable per core")
    assert "each replica is its own DistributedConfig(tp_size=2) holding the whole model" in eight.reason
    assert "fsdp=64" not in eight.reason and "FSDP alone" not in eight.reason
    # One replica per core was tried first and is too big.
    assert [(t["replicas"], t["tp_size"], t["fits"]) for t in eight.tried] == [(64, 1, False), (32, 2, True)]
    assert round(eight.tried[0]["total_bytes"] / GiB, 1) == 22.5
    assert "(32 replicas)  <- recommended" in str(eight)


def test_selective_checkpointing_keeps_every_other_layer_and_costs_computed_recompute():
    kwargs = dict(workload="train", batch=1, seq=4096)
    none, selective, full = (plan_memory("Qwen/Qwen3-8B", 4, 16, gradient_checkpointing=m, **kwargs)
                             for m in ("none", "selective", "full"))
    per_layer, layer_input = none.activation_detail["per_layer"], 4096 * 2 * 4096   # T * b * h
    assert selective.activation_detail["layers"] == pytest.approx(18 * per_layer + 18 * layer_input + per_layer, abs=1)
    assert full.activation_detail["layers"] == pytest.approx(36 * layer_input + per_layer, abs=1)
    assert full.total < selective.total < none.total and selective.training_state == none.training_state
    every3 = plan_memory("Qwen/Qwen3-8B", 4, 16, gradient_checkpointing="selective", checkpoint_every=3, **kwargs)
    assert every3.activation_detail["layers"] == pytest.approx(24 * per_layer + 12 * layer_input + per_layer, abs=1)
    assert selective.checkpointing_label == "selective activation checkpointing (every 2nd layer)"
    assert planning._checkpointed_layers(36, "selective") == 18 and planning._checkpointed_layers(36, False) == 0
    # A step is about 3 forwards; full checkpointing adds the layers' forward (a bit under a third).
    full_cost = planning.recompute_fraction("Qwen/Qwen3-8B", 4096, "full")
    assert 0.28 < full_cost < 1 / 3
    assert planning.recompute_fraction("Qwen/Qwen3-8B", 4096, "selective") == pytest.approx(full_cost / 2)
    assert planning.recompute_fraction("Qwen/Qwen3-8B", 4096, "none") == 0
    with pytest.raises(PlanError, match="gradient_checkpointing='some'"):
        plan_memory("Qwen/Qwen3-8B", workload="train", gradient_checkpointing="some")


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
        get_instance("trn9.huge")
    with pytest.raises(PlanError, match="XLA-based torch-neuronx") as info:
        plan_mesh("Qwen/Qwen3-8B", "trn1.32xlarge")
    assert "trn2 and trn3 only" in str(info.value)
    assert issubclass(PlanError, ValueError)


def test_a_mesh_that_does_not_divide_gives_the_launch_message():
    def launch_message(*args, **kwargs):
        with pytest.raises(PlanError) as info:
            validate_parallel_sizes(*args, **kwargs)
        return str(info.value)

    config = models.load_config("Qwen/Qwen3-8B")
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


def test_a_tp_the_heads_do_not_divide_by_is_refused_for_that_reason():
    # issue 16 item 14: the heads, not "fsdp_size=21 = 63 processes".
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", tp_size=3)
    assert str(info.value).startswith("tp_size=3 does not divide the model's attention heads = 32, key/value "
                                      "heads = 8")
    assert "Use tp_size in [1, 2, 4, 8] on trn2.48xlarge (64 ranks)" in str(info.value)
    assert "63" not in str(info.value)
    with pytest.raises(PlanError, match=r"tp_size=3 does not divide .* Use tp_size in \[1, 2, 4, 8\]\.$"):
        plan_memory("Qwen/Qwen3-8B", tp_size=3)
    for bad in (0, -4, True):
        with pytest.raises(PlanError, match=f"tp_size={bad!r}: give a whole number >= 1"):
            plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", tp_size=bad)
    with pytest.raises(PlanError, match="fsdp_size=0: give a whole number >= 1"):
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", fsdp_size=0)
    with pytest.raises(PlanError, match=r"fsdp_size=3 does not divide the 64 ranks of trn2.48xlarge"):
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", fsdp_size=3)


def test_a_given_mesh_is_explained_as_given():
    # issue 15 item 14: `plan --tp 4 --fsdp 16` is not "the smallest tensor-parallel size (no TP needed)".
    given = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=4096, tp_size=4, fsdp_size=16)
    assert given.reason.startswith("Planned the mesh you gave: tp=4 x fsdp=16 with selective activation checkpointing")
    assert "smallest" not in given.reason and "no TP needed" not in given.reason
    assert '"Keep TP4 within a chip"' in given.reason
    across = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=4096, tp_size=8)
    assert "tp=8 spans 2 chips, against Neuron's \"Keep TP4 within a chip\": you asked for it." in across.reason


def test_a_file_is_not_taken_for_a_model(tmp_path, capsys):
    # issue 16 item 3, issue 23 item 4: a file is refused, naming the folder to pass (never a UnicodeDecodeError).
    (tmp_path / "config.json").write_text(models.SHIPPED_MODELS["Qwen/Qwen3-0.6B"].read_text())
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    for file in ("model.safetensors", "config.json"):
        with pytest.raises(SettingError) as info:
            plan_memory(tmp_path / file)
        assert str(info.value) == (f"{str(tmp_path / file)!r} names a file, not a model: pass the folder that holds "
                                   f"config.json, {str(tmp_path)!r}")
    assert plan_main(["--model", str(tmp_path / "model.safetensors")]) == 2
    assert "pass the folder that holds config.json" in capsys.readouterr().err
    assert plan_memory(tmp_path).total == plan_memory("Qwen/Qwen3-0.6B").total  # the fix
    (tmp_path / "config.json").write_bytes(bytes(range(256)))
    with pytest.raises(PlanError, match="config.json is not a model config \\(a binary file, not JSON\\)"):
        plan_memory(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(PlanError, match="JSON of a list, not a config object"):
        plan_memory(tmp_path)


def test_a_config_without_the_needed_fields_names_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    with pytest.raises(PlanError, match="lacks intermediate_size, num_hidden_layers, num_attention_heads, "
                                        "num_key_value_heads, vocab_size"):
        plan_memory(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "vocab_size": 100}))
    with pytest.raises(PlanError, match=r"config.json lacks model_type"):
        plan_memory(tmp_path)
    with pytest.raises(PlanError, match="workload='serve'"):
        plan_memory("Qwen/Qwen3-0.6B", workload="serve")
    with pytest.raises(PlanError, match="master_weights='fp8'"):
        plan_memory("Qwen/Qwen3-0.6B", workload="train", master_weights="fp8")


def _fixes(error: PlanError) -> list[list[str]]:
    """The command-line flags of each fix a no-fit PlanError names."""
    return [fix.split(" (")[0].split() for fix in str(error).split("What would fit: ")[1][:-1].split("; ")]


def _plans(args: list[str], capsys) -> bool:
    """Whether ``python -m trnlab plan ARGS`` finds a mesh that fits (its output swallowed)."""
    code = plan_main(args)
    capsys.readouterr()
    return code == 0


def test_a_workload_that_fits_no_mesh_names_the_flags_that_would(capsys):
    args = ["--model", "Qwen/Qwen3-8B", "--instance", "trn2.3xlarge", "--train", "--batch", "2", "--seq", "4096"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.3xlarge", "train", batch=2, seq=4096)
    assert str(info.value) == (
        "Qwen/Qwen3-8B training (micro-batch 2 x 4096 per rank) fits no mesh on trn2.3xlarge even with full activation "
        "checkpointing: the leanest, tp=4 x fsdp=1, needs 45.4 GiB per core, 21.6 GiB usable per core (24 GiB of HBM "
        "minus the planner's assumed 10% headroom; the runtime's own overhead is not published). What would fit: "
        "--nodes 6 (tp=4 x fsdp=6 with full activation checkpointing: 20.6 GiB per core); --instance trn2.48xlarge "
        "(tp=1 x fsdp=64 with full activation checkpointing: 20.2 GiB per core).")
    # Each fix, added to the command, plans; the fewest nodes are named (one fewer is a near miss that fails).
    assert _fixes(info.value) == [["--nodes", "6"], ["--instance", "trn2.48xlarge"]]
    assert all(_plans(args + fix, capsys) for fix in _fixes(info.value))
    assert not _plans(args + ["--nodes", "5"], capsys) and not _plans(args, capsys)
    # A fixed lighter checkpointing is told which heavier one fits, at the same batch.
    args = ["--model", "Qwen/Qwen3-8B", "--train", "--seq", "8192", "--checkpointing", "none"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", batch=1, seq=8192, gradient_checkpointing="none")
    assert str(info.value).endswith("What would fit: --checkpointing full (tp=1 x fsdp=64 with full activation "
                                    "checkpointing: 20.2 GiB per core).")
    assert _plans(args + ["--checkpointing", "full"], capsys) and not _plans(args + ["--checkpointing", "selective"],
                                                                            capsys)
    # No one change fits: the leanest settings, on more nodes and on a larger instance, each planned and fitting.
    args = ["--model", "Qwen/Qwen3-32B", "--instance", "trn2.3xlarge", "--train", "--batch", "4", "--seq", "4096"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-32B", "trn2.3xlarge", "train", batch=4, seq=4096)
    assert str(info.value).split("What would fit: ")[1] == (
        "--batch 1 --nodes 12 (tp=4 x fsdp=12 with full activation checkpointing: 20.5 GiB per core); --batch 1 "
        "--instance trn2.48xlarge (tp=4 x fsdp=16 with full activation checkpointing: 17.9 GiB per core).")
    assert all(_plans(args + fix, capsys) for fix in _fixes(info.value))
    assert not _plans(args + ["--batch", "1", "--nodes", "8"], capsys)   # 8 is the count tried below 12


def test_node_counts_and_instances_are_each_tried_since_some_take_no_mesh(capsys):
    # Qwen3-4B's tied vocabulary (151,936 rows) divides by tp x fsdp on 2 x trn2.3xlarge (8 ranks), not on 5 (20 ranks):
    # more room is not always a mesh, so the fewest nodes are found by trying each count, not by bisection.
    args = ["--model", "Qwen/Qwen3-4B", "--instance", "trn2.3xlarge", "--train", "--batch", "4", "--seq", "4096"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-4B", "trn2.3xlarge", "train", batch=4, seq=4096)
    assert _fixes(info.value) == [["--batch", "1", "--nodes", "2"], ["--batch", "1", "--instance", "trn2.48xlarge"]]
    assert all(_plans(args + fix, capsys) for fix in _fixes(info.value))
    assert not _plans(args + ["--batch", "1", "--nodes", "5"], capsys)  # no mesh of 20 ranks suits it
    # A larger instance instead of several nodes says --nodes 1, so that the flags added to the command plan it.
    args = ["--model", "Qwen/Qwen3-32B", "--instance", "trn2.3xlarge", "--train", "--nodes", "2", "--batch", "4",
            "--seq", "8192"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-32B", "trn2.3xlarge", "train", nodes=2, batch=4, seq=8192)
    assert ["--batch", "1", "--instance", "trn2-ultraserver", "--nodes", "1"] in _fixes(info.value)
    assert all(_plans(args + fix, capsys) for fix in _fixes(info.value))


def test_a_given_mesh_told_to_serve_with_replicas_is_told_to_drop_its_mesh():
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "inference", batch=32, seq=8192, tp_size=1, fsdp_size=64)
    assert str(info.value).endswith("What would fit: without --tp/--fsdp (16 replicas of tp=4: 21.3 GiB per core).")


def test_a_long_sequence_is_told_the_longest_that_fits_and_where(capsys):
    # Nothing fits a trn2.3xlarge at any length: the sequence is halved until a larger instance fits it.
    args = ["--model", "Qwen/Qwen3-8B", "--instance", "trn2.3xlarge", "--train", "--seq", "32768"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.3xlarge", "train", seq=32768)
    assert _fixes(info.value) == [["--seq", "16384", "--instance", "trn3-gen1-ultraserver"]]
    assert _plans(args + _fixes(info.value)[0], capsys)
    assert not _plans(args + ["--instance", "trn3-gen1-ultraserver"], capsys)   # the halving was needed


def test_a_given_mesh_that_does_not_fit_is_told_the_mesh_flags_too(capsys):
    # The user's --tp/--fsdp stay on the command line: every fix names the mesh it planned.
    args = ["--model", "Qwen/Qwen3-8B", "--instance", "trn2.3xlarge", "--train", "--seq", "4096", "--tp", "1",
            "--fsdp", "4"]
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.3xlarge", "train", seq=4096, tp_size=1, fsdp_size=4)
    assert str(info.value).startswith("Qwen/Qwen3-8B training (micro-batch 1 x 4096 per rank) does not fit tp=1 x "
                                      "fsdp=4 on trn2.3xlarge even with full activation checkpointing: it needs 41.0")
    assert _fixes(info.value) == [["--nodes", "3", "--tp", "1", "--fsdp", "12"],
                                  ["--instance", "trn2.48xlarge", "--tp", "4", "--fsdp", "16"]]
    assert all(_plans(args + fix, capsys) for fix in _fixes(info.value))
    # Where the ladder fits on the same instance, its mesh is the one fix.
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=4096, tp_size=1, fsdp_size=64,
                  gradient_checkpointing="none")
    assert _fixes(info.value) == [["--tp", "8", "--fsdp", "8"]]


def test_a_huge_batch_is_answered_by_bisection(monkeypatch):
    # issue 16 item 4: the "what would fit" search bisects the batch instead of trying every smaller one: about 17
    # mesh searches per bisection over 100,000 batches, where trying each would be 100,000 (counted, not timed)
    import trnlab.planning as planning

    searches, search = [], planning._search
    monkeypatch.setattr(planning, "_search", lambda *a, **k: searches.append(1) or search(*a, **k))
    for workload in ("inference", "train"):
        searches.clear()
        with pytest.raises(PlanError) as info:
            plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", workload, batch=100_000, seq=2048)
        assert 0 < len(searches) <= 40, f"{workload}: {len(searches)} mesh searches"
        batch = int(str(info.value).split("What would fit: --batch ")[1].split()[0])
        fits = plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", workload, batch=batch, seq=2048)
        assert fits.recommended.fits
        with pytest.raises(PlanError):   # the largest: one more does not fit
            plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", workload, batch=batch + 1, seq=2048)


def test_a_seq_past_the_models_positions_is_refused_and_none_is_suggested():
    # issue 23 item 9: `plan --seq 10000000` suggested a --seq far past the model's 40,960 positions, unsaid.
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=10_000_000)
    assert str(info.value) == ("seq=10000000: the model takes at most 40960 positions (Qwen/Qwen3-8B's "
                               "max_position_embeddings): use seq <= 40960")
    with pytest.raises(PlanError, match=r"cache_length=40961: the model takes at most 40960 positions"):
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", seq=1024, cache_length=40961)
    # At the limit it plans; the shorter --seq it suggests is within the limit and fits.
    with pytest.raises(PlanError) as info:
        plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=40960)
    seq = int(str(info.value).split("What would fit: --seq ")[1].split()[0])
    assert seq < 40960 and plan_mesh("Qwen/Qwen3-8B", "trn2.48xlarge", "train", seq=seq).recommended.fits
    # The default seq is 2048, or the model's positions if fewer.
    config = models.load_config("Qwen/Qwen3-0.6B")
    config.max_position_embeddings = 1024
    assert plan_mesh(config, "trn2.3xlarge").settings["seq"] == 1024
    assert plan_mesh("Qwen/Qwen3-0.6B", "trn2.3xlarge").settings["seq"] == 2048


def test_cli_refuses_a_seq_past_the_models_positions(capsys):
    assert plan_main(["--model", "Qwen/Qwen3-8B", "--train", "--seq", "10000000"]) == 2
    assert capsys.readouterr().err == ("error: seq=10000000: the model takes at most 40960 positions "
                                       "(Qwen/Qwen3-8B's max_position_embeddings): use seq <= 40960\n")


# ------------------------------------------------------------------ command line


def test_cli_json_for_a_shipped_model_works_offline(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from trnlab.__main__ import main as trnlab_main

    assert trnlab_main(["plan", "--model", "Qwen/Qwen3-8B", "--instance", "trn2.48xlarge", "--train",
                        "--seq", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Qwen/Qwen3-8B" and out["world_size"] == 64
    assert (out["recommended"]["tp_size"], out["recommended"]["fsdp_size"]) == (4, 16)
    assert out["recommended"]["checkpointing"] == out["checkpointing"] == "selective"
    assert out["recommended"]["plan"]["total_bytes"] <= out["budget_bytes"]
    assert trnlab_main(["plan", "--model", "Qwen/Qwen3-8B", "--train", "--seq", "4096", "--checkpointing", "full",
                        "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["recommended"]["tp_size"], out["checkpointing"]) == (1, "full")
    assert trnlab_main(["plan", "--model", "Qwen/Qwen3-8B", "--tp", "0"]) == 2
    assert capsys.readouterr().err == "error: tp_size=0: give a whole number >= 1\n"


def test_cli_reads_a_config_file_and_trnlab_model(capsys, monkeypatch, tmp_path):
    config = json.loads(models.SHIPPED_MODELS["Qwen/Qwen3-0.6B"].read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("TRNLAB_MODEL", str(tmp_path))
    assert plan_main(["--instance", "trn2.3xlarge", "--tp", "2", "--fsdp", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{tmp_path}, inference on trn2.3xlarge: 4 logical NeuronCores")
    assert "<- recommended" in text
    assert plan_main(["--model", "Qwen3-8B", "--instance", "trn1.32xlarge"]) == 2
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

