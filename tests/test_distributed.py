"""trnlab.distributed: the 2 x 2 sharded model equals one process; helpers behave on their own.

One real 4-process CPU gloo run serves every check. Its ranks run ``examples/train_sharded.py``
(3 steps) against the one-process reference (same loss on the same batch, same training
losses, the shards' placements and bytes, a saved model that reloads in one process and
generates what the sharded model generated), then ``tests/scripts/measure_memory.py``, whose
bytes per rank ``trnlab.planning`` must predict. The same script on the STAND-IN neuron device (backend ``neuron``,
``MULTI_NEURON``) must match that run rank by rank.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import trnlab
from trnlab import distributed as td
from trnlab import plots
from trnlab import training
from trnlab.launcher import launch
from trnlab.planning import plan_memory
from tests.test_standin import needs_compiler

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train_sharded.py"
MEASURE_SCRIPT = Path(__file__).resolve().parent / "scripts" / "measure_memory.py"
RANK_SCRIPTS = Path(__file__).resolve().parent / "rank_scripts.py"
MEASURE_BATCH, MEASURE_SEQ = 2, 32  # micro-batch per FSDP rank in the memory measurement
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_distributed.ipynb"
STEPS, BATCH, BLOCK = 3, 8, 64
TOL = 1e-4  # fp32; the sharded sums run in another order, so not bit-identical


# ------------------------------------------------------------------ helpers on their own


def test_finish_closes_the_group_flushes_and_exits_with_the_code_before_teardown(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import atexit
        import torch.distributed as dist
        from trnlab.distributed import finish

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        atexit.register(print, "interpreter teardown ran")
        real_destroy = dist.destroy_process_group
        dist.destroy_process_group = lambda: (real_destroy(), print(f" closed: {dist.is_initialized()=}"))
        print("still buffered", end="")  # no newline, no flush: finish must write it out
        finish(3)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "still buffered closed: dist.is_initialized()=False\n"  # atexit never ran: no teardown


@pytest.mark.parametrize("script", sorted(
    p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("examples/*.py"), *ROOT.glob("tests/scripts/*.py")]
    if ("init_process_group" in p.read_text() or "DistributedConfig" in p.read_text())
    and not p.name.startswith("guide_")))  # a learner's own script, unmodified: the stand-in hands gloo host views
def test_every_rank_script_ends_with_finish(script):  # made in C++, which hold no Python object (no such race)
    text = (ROOT / script).read_text()
    if spawned := re.search(r"mp\.spawn\((\w+)", text):  # its ranks run that function: it ends them
        text = text.split(f"def {spawned.group(1)}(", 1)[1].split("\n\n\n", 1)[0]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert re.fullmatch(r"(td\.)?finish\(.*\)", last.split("#")[0].strip()), f"{script} ends with {last!r}"


def test_index_ranges_and_chunks_describe_shards():
    assert td._index_ranges([0, 1, 2, 5, 6, 9]) == "0-2,5-6,9"
    assert td._index_ranges([]) == "-"
    rows = list(range(761))  # torch.chunk: ceil-sized pieces, the last one shorter
    assert [len(td._chunk(rows, 2, i)) for i in (0, 1)] == [381, 380]


def test_batches_are_cut_in_order_cycling_through_the_data():
    dataset = [{"input_ids": torch.full((4,), i)} for i in range(5)]
    batches = td.global_batches(dataset, batch_size=4, steps=2)
    assert batches[0]["input_ids"][:, 0].tolist() == [0, 1, 2, 3]
    assert batches[1]["input_ids"][:, 0].tolist() == [4, 0, 1, 2]  # cycles through the data
    with pytest.raises(ValueError, match="dataset is empty"):
        td.global_batches([], 4, 1)


def test_pad_vocabulary_keeps_an_already_divisible_model(tmp_path):
    # The bundled vocabulary (761) does not divide by 64, so it is padded to 768; that copy
    # already divides, so padding it again must hand it back untouched and write nothing.
    padded = td.pad_vocabulary(trnlab.model_name(), tmp_path / "padded", multiple=64)
    assert padded == str(tmp_path / "padded") and trnlab.load_config(padded).vocab_size == 768
    assert td.pad_vocabulary(padded, tmp_path / "copy", multiple=64) == padded
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("multiple", [0, -64, 2.5, True, "64"])
def test_pad_vocabulary_refuses_a_multiple_that_is_not_a_positive_whole_number(tmp_path, multiple):
    with pytest.raises(ValueError, match=r"^multiple=.*: give a whole number >= 1$"):
        td.pad_vocabulary(None, tmp_path / "padded", multiple=multiple)
    assert not (tmp_path / "padded").exists()  # refused before anything was loaded or written


def test_pad_vocabulary_never_shrinks_and_the_new_rows_are_sampled_not_the_mean(tmp_path, capsys):
    original = trnlab.load_model(None, device="cpu", dtype=torch.float32)
    old_rows = original.get_input_embeddings().weight.detach()
    padded = td.pad_vocabulary(None, tmp_path / "padded", multiple=5)  # 761 -> 765, never 760
    assert "vocabulary padded from 761 to 765 rows (a multiple of 5)" in capsys.readouterr().out
    rows = trnlab.load_model(padded, device="cpu", dtype=torch.float32).get_input_embeddings().weight.detach()
    assert rows.shape == (765, old_rows.shape[1]) and torch.equal(rows[:761], old_rows)
    new = rows[761:]
    assert not torch.allclose(new, old_rows.mean(0).expand_as(new))  # drawn from a normal, not the mean
    assert len({tuple(r.tolist()) for r in new}) == 4                 # four different rows
    assert td.pad_vocabulary(None, tmp_path / "again", multiple=5) == str(tmp_path / "again")
    again = trnlab.load_model(tmp_path / "again", device="cpu", dtype=torch.float32)
    assert torch.equal(again.get_input_embeddings().weight.detach(), rows)  # seeded: the same rows


def test_pad_vocabulary_never_overwrites_a_model_unless_told(tmp_path, capsys):
    folder = td.pad_vocabulary(None, tmp_path / "padded", multiple=64)
    before = (tmp_path / "padded" / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match=r"already holds config.json.*overwrite=True"):
        td.pad_vocabulary(None, folder, multiple=100)
    assert (tmp_path / "padded" / "model.safetensors").read_bytes() == before
    assert trnlab.load_config(folder).vocab_size == 768
    capsys.readouterr()
    assert td.pad_vocabulary(None, folder, multiple=100, overwrite=True) == folder
    assert trnlab.load_config(folder).vocab_size == 800  # told to: replaced
    assert "vocabulary padded from 761 to 800 rows" in capsys.readouterr().out


def test_pad_vocabulary_refuses_a_file_and_the_bundled_model(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        td.pad_vocabulary(None, target)
    assert target.read_text() == "keep me"
    with pytest.raises(FileExistsError, match="bundled model"):
        td.pad_vocabulary(None, trnlab.model_name(), overwrite=True)
    (tmp_path / "empty").mkdir()  # an empty folder is fine
    assert trnlab.load_config(td.pad_vocabulary(None, tmp_path / "empty")).vocab_size == 768


def test_the_one_process_reference_trains_the_global_batch_in_order(tmp_path):
    model = trnlab.load_model(None, device="cpu", dtype=torch.float32).train()
    dataset = training.packed_dataset(trnlab.load_tokenizer(), training.training_texts(8), 32)
    losses = td.train_single_process(model, dataset, steps=2, batch_size=4, output_dir=tmp_path)
    assert len(losses) == 2 and all(loss > 0 for loss in losses)


# ------------------------------------------------------------------ one real sharded run


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """Notebook 05's script, then planning's memory measurement, in the same 4 ranks: one start-up."""
    folder = tmp_path_factory.mktemp("sharded")
    model = td.pad_vocabulary(None, folder / "padded")  # 761 rows do not split 4 ways (see launch)
    result = launch(RANK_SCRIPTS, [SCRIPT, "--out", folder / "run", "--model", model, "--steps", STEPS,
                                   "--batch-size", BATCH, "--block-length", BLOCK,
                                   "--then", MEASURE_SCRIPT, "--out", folder / "measured", "--model", model,
                                   "--tp-size", 2, "--fsdp-size", 2, "--batch", MEASURE_BATCH, "--seq", MEASURE_SEQ],
                    tp_size=2, fsdp_size=2, model=model, device="cpu", timeout=400)
    assert result.ok, f"{result}\n{result.traceback}"
    measured = sorted((json.loads(p.read_text()) for p in (folder / "measured").glob("rank*.json")),
                      key=lambda r: r["rank"])
    return {"model": model, "folder": folder, "run": td.read_run(folder / "run"), "result": result,
            "measured": measured}


@pytest.fixture(scope="module")
def reference(sharded_run):
    """The same model, data and optimizer in this one process."""
    model = trnlab.load_model(sharded_run["model"], device="cpu", dtype=torch.float32)
    tokenizer = trnlab.load_tokenizer(sharded_run["model"])
    dataset = training.packed_dataset(tokenizer, training.training_texts(64), BLOCK)
    first = td.global_batches(dataset, BATCH, 1)[0]
    loss_before = td.batch_loss(model, first)
    losses = td.train_single_process(model, dataset, steps=STEPS, batch_size=BATCH)
    return {"loss_before": loss_before, "losses": losses,
            "generation": td.greedy_text(model, tokenizer, training.NEW_FACT_PROMPT)}


def test_every_rank_ran_on_the_2x2_mesh_and_says_which_training_path(sharded_run):
    ranks = sharded_run["run"]["ranks"]
    assert [(r["rank"], r["fsdp"], r["tp"]) for r in ranks] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    # On CPU Accelerate refuses the sharded model as it is (its own words, recorded by the script);
    # the script then builds the Trainer inside the shim, and every rank says so.
    assert "ParallelismConfig" in sharded_run["run"]["refusal"]
    assert "DistributedType.MULTI_CPU" in sharded_run["run"]["refusal"]
    trained = [line for r in range(4) for line in sharded_run["result"].lines(r) if line.startswith("trained")]
    assert trained == ["trained with Trainer (CPU mesh: built inside td.cpu_mesh_as_multi_device)"] * 4


def test_sharded_loss_equals_one_process_loss_on_the_same_batch(sharded_run, reference):
    for r in sharded_run["run"]["ranks"]:
        assert r["loss_before"] == pytest.approx(reference["loss_before"], abs=1e-5)


def test_sharded_training_gives_the_one_process_losses(sharded_run, reference):
    ranks = sharded_run["run"]["ranks"]
    assert len(ranks[0]["losses"]) == STEPS
    assert ranks[0]["losses"] == pytest.approx(reference["losses"], abs=TOL)
    assert reference["losses"][-1] < reference["losses"][0] - 1.0  # it really trains
    assert all(r["losses"] == ranks[0]["losses"] for r in ranks)  # Trainer logs the global batch's loss


def test_each_rank_holds_a_quarter_and_the_shards_tile_every_weight(sharded_run):
    ranks = sharded_run["run"]["ranks"]
    full = ranks[0]["full_bytes"]
    assert full == trnlab.parameter_count(trnlab.load_model(sharded_run["model"], device="cpu")) * 4
    for r in ranks:
        assert 0.24 * full < r["local_bytes"] < 0.26 * full
    # Only the per-head q/k norms are copied on both TP ranks: everything else is held once.
    assert sum(r["local_bytes"] for r in ranks) == pytest.approx(full, rel=0.002)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        params = [next(p for p in r["parameters"] if p["name"] == name) for r in ranks]
        assert all("?" not in (p["rows"], p["cols"]) for p in params)  # checked against full_tensor()
        cells = {(p["rows"], p["cols"]) for p in params}
        assert len(cells) == 4  # four different pieces of the same weight
    q_rows = [next(p for p in r["parameters"] if p["name"].endswith("0.self_attn.q_proj.weight"))["rows"]
              for r in ranks]
    assert q_rows == ["0-47", "96-143", "48-95", "144-191"]  # TP halves, each split again by FSDP


def test_saved_model_reloads_in_one_process_and_generates_the_same(sharded_run, reference):
    saved = sharded_run["folder"] / "run" / "model"
    model = trnlab.load_model(saved, device="cpu")
    assert not any(hasattr(p, "placements") for p in model.parameters())  # plain tensors again
    text = td.greedy_text(model, trnlab.load_tokenizer(saved), training.NEW_FACT_PROMPT)
    assert text == sharded_run["run"]["generation"]
    assert text == reference["generation"]
    assert text.startswith(training.NEW_FACT_PROMPT) and len(text) > len(training.NEW_FACT_PROMPT) + 10


def test_the_notebook_launches_this_script():
    sources = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]]
    assert not any(s.startswith("%%writefile") and "train_sharded" in s for s in sources)
    assert any("examples/train_sharded.py" in s for s in sources)


# ------------------------------------------------------------------ the STAND-IN neuron device against CPU gloo


@pytest.fixture(scope="module")
def standin_run(sharded_run):
    """The script again on the stand-in's `neuron` process group: the same arguments, 4 ranks."""
    folder = sharded_run["folder"]
    command = [sys.executable, "-m", "trnlab", "launch", "--tp-size", "2", "--fsdp-size", "2", "--model",
               sharded_run["model"], "--timeout", "400", str(SCRIPT), "--out", str(folder / "standin"), "--model",
               sharded_run["model"], "--steps", str(STEPS), "--batch-size", str(BATCH), "--block-length", str(BLOCK)]
    run = subprocess.run(command, env={**os.environ, "TRNLAB_NEURON_STANDIN": "1"}, capture_output=True, text=True,
                         timeout=450)
    assert run.returncode == 0, run.stdout[-4000:]
    return {"stdout": run.stdout, "run": td.read_run(folder / "standin")}


@needs_compiler
def test_on_the_standin_trainer_takes_the_sharded_model_as_is(standin_run):
    assert "4 process(es) on neuron, backend neuron" in standin_run["stdout"]
    assert standin_run["run"]["refusal"] is None  # MULTI_NEURON: Accelerate takes it, no shim
    assert standin_run["stdout"].count("]: trained with Trainer\n") == 4


@needs_compiler
def test_the_standin_run_matches_cpu_gloo_rank_by_rank(sharded_run, standin_run):
    parity = td.compare_runs(sharded_run["run"], standin_run["run"], tolerance=1e-4)
    assert parity.ok, str(parity)
    assert parity.compared == 4 * STEPS * 5  # loss, gradient norm, three updates; per rank and step
    assert standin_run["run"]["generation"] == sharded_run["run"]["generation"]


def _parity_run(values):
    return {"ranks": [{"rank": r, "parity": [{"step": s + 1, "loss": loss, "grad_norm": 2.0,
                                               "update": {"w": 0.5, "v": upd}} for s, (loss, upd) in enumerate(steps)]}
                      for r, steps in enumerate(values)]}


def test_compare_runs_names_the_first_rank_step_and_tensor_that_differ():
    a = _parity_run([[(3.0, 0.1), (2.0, 0.1)], [(3.0, 0.1), (2.0, 0.1)]])
    same = td.compare_runs(a, a)
    assert same.ok and same.compared == 16 and same.largest == 0 and "16 values" in str(same)
    near = _parity_run([[(3.0, 0.1), (2.0, 0.1)], [(3.0, 0.1), (2.0, 0.10002)]])  # 2e-4 relative: a near miss
    found = td.compare_runs(a, near, tolerance=1e-4)
    assert not found.ok and found.first_difference == "rank 1, step 2, update of v: 0.1 against 0.10002"
    assert td.compare_runs(a, near, tolerance=1e-3).ok  # within a looser bound
    with pytest.raises(ValueError, match="rank 0 recorded 2 and 1 steps"):
        td.compare_runs(a, _parity_run([[(3.0, 0.1)], [(3.0, 0.1)]]))
    with pytest.raises(ValueError, match="the runs have 2 and 1 ranks"):
        td.compare_runs(a, _parity_run([[(3.0, 0.1), (2.0, 0.1)]]))


# ------------------------------------------------------------------ tables and pictures


def _fake_report(rank, fsdp, tp):
    row = {"name": "model.layers.0.self_attn.q_proj.weight", "shape": [8, 4], "local_shape": [2, 4],
           "placements": {"fsdp": "_S(0, 2)", "tp": "S(0)"}, "local_bytes": 32, "full_bytes": 128,
           "rows": f"{2 * (2 * tp + fsdp)}-{2 * (2 * tp + fsdp) + 1}", "cols": "0-3"}
    return {"rank": rank, "fsdp": fsdp, "tp": tp, "fsdp_size": 2, "tp_size": 2, "parameters": [row],
            "local_bytes": 32, "full_bytes": 128, "losses": [2.5, 1.5]}


def test_tables_and_mesh_picture_from_reports():
    import matplotlib

    matplotlib.use("Agg")
    ranks = [_fake_report(r, r // 2, r % 2) for r in range(4)]
    table = plots.memory_table(ranks)
    assert "   0     0   0           8          32        25.0%" in table
    assert "all" in table and "100.0%" in table
    placements = plots.placement_table(ranks, [ranks[0]["parameters"][0]["name"]])
    assert "rank 1 (fsdp 0, tp 1): (2, 4)      rows 4-5, cols 0-3" in placements
    ax = plots.plot_mesh(ranks, ["model.layers.0.self_attn.q_proj.weight"])
    assert len(ax.texts) == 4 and "rank 3  (fsdp 1, tp 1)" in ax.texts[3].get_text()
    ax = plots.plot_losses(ranks, reference=[2.5, 1.5])
    assert len(ax.lines) == 6


# ------------------------------------------------------------------ measured on 4 ranks: what planning predicts


def test_predicted_parameter_bytes_equal_what_each_rank_holds(sharded_run):
    plan = plan_memory(sharded_run["model"], 2, 2, workload="train", batch=MEASURE_BATCH, seq=MEASURE_SEQ,
                       dtype="float32")
    assert [r["rank"] for r in sharded_run["measured"]] == [0, 1, 2, 3]
    assert plan.components["parameters"] == 1_773_696 and plan.parameter_count * 4 == 7_086_336
    for rank in sharded_run["measured"]:
        assert rank["parameter_bytes_loaded"] == plan.components["parameters"]
        assert rank["parameter_bytes"] == plan.components["parameters"]
        assert rank["parameter_tensors"] == len(plan.shards)


def test_predicted_training_state_is_within_5_percent_of_what_each_rank_holds(sharded_run):
    plan = plan_memory(sharded_run["model"], 2, 2, workload="train", batch=MEASURE_BATCH, seq=MEASURE_SEQ,
                       dtype="float32")
    for rank in sharded_run["measured"]:
        assert rank["training_state_bytes"] == pytest.approx(plan.training_state, rel=0.05)
        assert rank["gradient_bytes"] == plan.components["gradients"]
        assert rank["optimizer_bytes"] == plan.components["optimizer"]
