"""trnlab.training: TrainingArguments as the page teaches, recompile tracking, resume, plots."""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys

import pytest
import torch

from trnlab import _compat, plots, training
from trnlab.models import load_tokenizer


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def tiny_model(tokenizer, seed: int = 0):
    """A one-layer Qwen3 with the course tokenizer: the real class, cheap to trace and train."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    return Qwen3ForCausalLM(config)


@pytest.fixture
def packed(tokenizer):
    return training.packed_dataset(tokenizer, training.training_texts(40, seed=1), 16)


def page_arguments(output_dir, max_steps=1, backend="eager", **more):
    """The page's TrainingArguments on CPU, as notebook 04 writes them."""
    from transformers import TrainingArguments

    settings = dict(output_dir=str(output_dir), bf16=False, torch_compile=True, torch_compile_backend=backend,
                    dataloader_drop_last=True, use_cpu=True, max_steps=max_steps, per_device_train_batch_size=2,
                    learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                    report_to="none", disable_tqdm=True)
    return TrainingArguments(**{**settings, **more})


def page_trainer(model, args, rows, collator, callbacks=(), static=True):
    """``Trainer(...)`` as notebook 04 builds it: static shapes, the recorder watching the collator."""
    from transformers import PrinterCallback, Trainer

    recorders = [c for c in callbacks if isinstance(c, training.TrainingRecorder)]
    if recorders:
        collator = recorders[0].watch(collator)
    with training._static_shape_compiles() if static else contextlib.nullcontext():
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collator, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)
    return trainer


def test_precision_choice_says_the_dtype_the_weights_were_loaded_in(tokenizer, packed, tmp_path):
    model = tiny_model(tokenizer).to(torch.bfloat16)  # as TRNLAB_DTYPE=bfloat16 loads it
    bf16, reason = training.precision_choice("cpu", model)
    assert bf16 is False and "so this run trains in bfloat16, the dtype the weights were loaded in;" in reason
    assert "trains in float32, the dtype the weights" in training.precision_choice("cpu", torch.float32)[1]
    assert "trains in the dtype the weights were loaded in (pass the model" in training.precision_choice("cpu")[1]
    assert "emulated" not in reason and "on Trainium the same call picks bf16=True." in reason
    with pytest.raises(TypeError, match="weights must be the loaded model or its torch dtype"):
        training.precision_choice("cpu", "bfloat16")
    # The reason is true: with bf16=False the Trainer trains the bf16 weights as they are.
    page_trainer(model, page_arguments(tmp_path, backend=None, torch_compile=False), packed,
                 training.PaddingCollator(tokenizer.pad_token_id, (16,))).train()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_page_arguments_are_the_page_s_call_with_the_course_s_choices(tmp_path):
    args = training._page_arguments(tmp_path, torch.device("cpu"), max_steps=3)
    assert args.device.type == "cpu" and args.use_cpu
    assert args.bf16 is False
    # Left unset, the backend is the one Transformers picks: inductor off Trainium.
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"
    assert args.dataloader_drop_last is True
    assert args.include_num_input_tokens_seen == "non_padding"
    assert args.disable_tqdm is False  # progress bars stay on, as Transformers would have them


@pytest.fixture
def neuron_for_transformers(fake_neuron, monkeypatch):
    """The fake Neuron device, visible to Transformers and Accelerate too; their caches cleared after."""
    from accelerate.utils import imports

    # TrainingArguments looks for torch_neuronx with importlib.util.find_spec, which needs a spec.
    monkeypatch.setattr(sys.modules["torch_neuronx"], "__spec__", importlib.machinery.ModuleSpec("torch_neuronx", None))
    monkeypatch.setattr(fake_neuron, "set_device", lambda device: None, raising=False)
    imports.is_neuron_available.cache_clear()
    yield fake_neuron
    imports.is_neuron_available.cache_clear()  # Accelerate caches the answer; later tests run on CPU


def test_training_arguments_on_neuron(neuron_for_transformers, tmp_path):
    from transformers import TrainingArguments

    # The page's own call, under a fake trn2: Transformers picks the device and the backend.
    args = TrainingArguments(output_dir=str(tmp_path), bf16=True, torch_compile=True)
    assert str(args.device) == "neuron:0" and args.bf16 is True and args.torch_compile_backend == "neuron"
    bf16, reason = training.precision_choice(torch.device("neuron", 0))
    assert bf16 is True and reason == "bf16=True: every Trainium generation computes in bfloat16 natively."
    assert training.precision_choice("neuron", torch.float32)[1].endswith(
        "; the float32 weights stay float32 (bf16=True is mixed precision).")
    built = training._page_arguments(tmp_path, torch.device("neuron", 0), max_steps=3)
    assert built.torch_compile_backend == "neuron" and built.bf16 is True
    with pytest.raises(ValueError, match="backend .inductor. cannot compile for a NeuronCore"):
        training._page_arguments(tmp_path, torch.device("neuron", 0), max_steps=3, compile_backend="inductor")


def test_static_shape_compiles_gives_dynamic_false_off_neuron(tokenizer, packed, tmp_path, monkeypatch):
    monkeypatch.delenv(_compat.ACCELERATE_DYNAMIC_ENV_VAR, raising=False)
    collator = training.PaddingCollator(tokenizer.pad_token_id, (16,))
    static = page_trainer(tiny_model(tokenizer), page_arguments(tmp_path, backend="aot_eager"), packed, collator)
    assert training.compile_settings(static) == {"backend": "aot_eager", "mode": "default", "dynamic": False}
    assert _compat.ACCELERATE_DYNAMIC_ENV_VAR not in os.environ  # restored after the block
    # Without it, Transformers leaves dynamic=None off Neuron: dynamo would go symbolic after two shapes.
    # (new TrainingArguments for each Trainer: the accelerator state they set up is shared)
    default = page_trainer(tiny_model(tokenizer), page_arguments(tmp_path, backend="aot_eager"), packed, collator,
                           static=False)
    assert training.compile_settings(default)["dynamic"] is None
    # The notebook's visible line does the same for the whole process.
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "false")
    visible = page_trainer(tiny_model(tokenizer), page_arguments(tmp_path, backend="aot_eager"), packed, collator,
                           static=False)
    assert training.compile_settings(visible)["dynamic"] is False
    eager = page_arguments(tmp_path, torch_compile=False, torch_compile_backend=None)
    assert training.compile_settings(page_trainer(tiny_model(tokenizer), eager, packed, collator)) == {}


def _rows_of_distinct_lengths(tokenizer, n):
    rows = training.tokenized_dataset(tokenizer, training.training_texts(200, seed=2), 128)
    by_length = {len(r["input_ids"]): r for r in rows}
    assert len(by_length) >= n
    return [by_length[k] for k in sorted(by_length)[:n]]


def test_recorder_sees_a_graph_per_new_shape_then_none(tokenizer, tmp_path):
    # Batches of one row, every row a different length: every step is a new shape.
    rows = _rows_of_distinct_lengths(tokenizer, 3)
    args = page_arguments(tmp_path / "dynamic", max_steps=3, per_device_train_batch_size=1)
    recorder = training.TrainingRecorder()
    page_trainer(tiny_model(tokenizer), args, rows, training.PaddingCollator(tokenizer.pad_token_id),
                 callbacks=[recorder]).train()
    assert [s.step for s in recorder.steps] == [1, 2, 3]
    assert len(recorder.shapes) == 3 and all(s.new_graphs == 1 for s in recorder.steps)
    assert recorder.graphs == 3 and recorder.graphs_after_warmup == 2
    assert recorder.summary()["steady_step_seconds"] is None  # every step compiled
    assert all(s.loss is not None and s.loss > 0 for s in recorder.steps)

    # Fixed length: the first step (warm-up) compiles the one graph, the rest reuse it.
    fixed = training.fixed_length_dataset(tokenizer, training.training_texts(16), 64, max_positions=128)
    args = page_arguments(tmp_path / "fixed", max_steps=4)
    recorder = training.TrainingRecorder()
    page_trainer(tiny_model(tokenizer), args, fixed, training.PaddingCollator(tokenizer.pad_token_id, (64,)),
                 callbacks=[recorder]).train()
    assert recorder.shapes == [(2, 64)]
    assert [s.new_graphs for s in recorder.steps] == [1, 0, 0, 0]
    assert recorder.graphs == 1 and recorder.graphs_after_warmup == 0
    summary = recorder.summary()
    assert summary["steady_step_seconds"] > 0 and summary["real_tokens_per_second"] > 0
    assert summary["padding_waste"] == pytest.approx(1 - sum(s.real_tokens for s in recorder.steps) / (4 * 2 * 64))
    assert 0 < summary["padding_waste"] < 1
    assert summary["final_loss"] == recorder.steps[-1].loss and (summary["steps"], summary["shapes"]) == (4, 1)


def _run(model, rows, collator, output_dir, stop_at=None, resume=None):
    # resuming does not depend on compiling; keep it fast
    args = page_arguments(output_dir, max_steps=6, torch_compile=False, torch_compile_backend=None,
                          save_strategy="steps", save_steps=2, seed=0, data_seed=0)
    recorder = training.TrainingRecorder()
    callbacks = [recorder] + ([training.StopAtStep(stop_at)] if stop_at else [])
    page_trainer(model, args, rows, collator, callbacks=callbacks).train(resume_from_checkpoint=resume)
    return {s.step: s.loss for s in recorder.steps}


def test_resume_continues_the_loss_curve_exactly(tokenizer, packed, tmp_path):
    collator = training.PaddingCollator(tokenizer.pad_token_id, (16,))
    uninterrupted = _run(tiny_model(tokenizer), packed, collator, tmp_path / "a")
    assert list(uninterrupted) == [1, 2, 3, 4, 5, 6]
    assert uninterrupted[6] < uninterrupted[1]

    # Interrupted after step 5: the last checkpoint is step 4, so step 5 is trained again.
    interrupted = _run(tiny_model(tokenizer), packed, collator, tmp_path / "b", stop_at=5)
    assert list(interrupted) == [1, 2, 3, 4, 5]
    checkpoint = training.last_checkpoint(tmp_path / "b")
    assert checkpoint.endswith("checkpoint-4")
    # A different initial model: the checkpoint's weights, optimizer, schedule and RNG must win.
    resumed = _run(tiny_model(tokenizer, seed=1), packed, collator, tmp_path / "b", resume=checkpoint)
    assert list(resumed) == [5, 6]
    for step in (5, 6):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-6, abs=1e-6)


def test_last_checkpoint_without_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint-N folder.*save_strategy=\"steps\", save_steps=N"):
        training.last_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="save_steps"):
        training.last_checkpoint(tmp_path / "missing")


def test_bad_training_inputs(tmp_path):
    with pytest.raises(ValueError, match="max_steps=0: give a whole number >= 1"):
        training._page_arguments(tmp_path, "cpu", max_steps=0)
    with pytest.raises(ValueError, match="step=0: give a whole number >= 1"):
        training.StopAtStep(0)


def test_live_plot_renders_and_stays_quiet_outside_ipython():
    plot = training.LiveLossPlot(reference={1: 3.0, 2: 2.5})
    plot.on_train_begin(None, None, None)
    assert plot._handle is None  # no IPython kernel here: nothing is displayed
    for step, loss in [(1, 3.1), (2, 2.4)]:
        plot.on_log(None, type("State", (), {"global_step": step})(), None, logs={"loss": loss})
    assert plot.steps == [1, 2] and plot.losses == [3.1, 2.4]
    assert plot._render().startswith(b"\x89PNG")


def test_comparison_table_and_chart():
    results = {"dynamic": {"graphs": 5, "compile_seconds": 9.5, "padding_waste": 0.2, "real_tokens_per_second": None},
               "packed": {"graphs": 1, "compile_seconds": 2.0, "padding_waste": 0.0, "real_tokens_per_second": 300.0}}
    table = plots.format_table(results)
    lines = table.splitlines()
    assert lines[0].split() == ["strategy", "graphs", "compile_seconds", "padding_waste", "real_tokens_per_second"]
    assert lines[1].split() == ["dynamic", "5", "9.500", "0.200", "-"]
    assert lines[2].split() == ["packed", "1", "2.000", "0.000", "300"]
    fig = plots.plot_strategy_comparison(results)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["graphs compiled", "padding waste (fraction)", "real tokens / s (steady)"]
    assert [p.get_height() for p in visible[0].patches] == [5, 1]
    assert [t.get_text() for t in visible[2].texts] == ["n/a"]  # dynamic: no steady step to measure


def test_notebook_04_writes_the_page_calls():
    import json
    import re
    from pathlib import Path

    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "04_training.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    calls = re.findall(r"TrainingArguments\((.*?)\)\n", source, flags=re.S)
    assert any(all(f in call for f in ("output_dir=", "bf16=", "torch_compile=True", "dataloader_drop_last=True"))
               for call in calls), calls
    assert "Trainer(model=" in source and ".train(" in source
    assert 'os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "false"' in source  # static shapes, visibly
    assert "ProfilerActivity.PrivateUse1" in source and "torch.neuron.get_dynamo_metrics()" in source
    assert "format_accelerator_memory(device)" in source
    markdown = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for wrong in ("derived by AOTAutograd", "inside the first backward", "seconds to minutes", "picked neuron:0"):
        assert wrong not in markdown, wrong


def test_the_benchmark_builds_its_arguments_with_page_arguments(tmp_path):
    import warnings

    from trnlab import bench

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the one builder does not warn: internal callers stay quiet
        built = training._page_arguments(tmp_path, "cpu", max_steps=2, batch_size=3, compile_backend="eager")
    assert (built.bf16, built.torch_compile, built.torch_compile_backend, built.dataloader_drop_last,
            built.use_cpu, built.max_steps, built.per_device_train_batch_size) == (
        False, True, "eager", True, True, 2, 3)
    names = bench._run_strategies.__code__.co_names  # what the benchmark's code calls, not its prose
    assert "_page_arguments" in names and "TrainingArguments" not in names
