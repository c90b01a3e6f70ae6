"""trnlab.training: TrainingArguments as the page teaches, recompile tracking, resume, plots."""

from __future__ import annotations

import importlib.machinery
import sys

import pytest
import torch

from trnlab import data, plots, training
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
    return data.packed_dataset(tokenizer, data.training_texts(40, seed=1), 16)


def test_training_arguments_on_cpu(tmp_path, capsys):
    args = training.training_arguments(tmp_path, torch.device("cpu"), max_steps=3)
    out = capsys.readouterr().out
    assert args.device.type == "cpu" and args.use_cpu
    assert args.bf16 is False and "bf16=False" in out and "float32" in out
    # Left unset, the backend is the one Transformers picks: inductor off Trainium.
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"
    assert "torch_compile_backend: 'inductor'" in out
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


def test_training_arguments_on_neuron(neuron_for_transformers, tmp_path, capsys):
    args = training.training_arguments(tmp_path, torch.device("neuron", 0), max_steps=3)
    out = capsys.readouterr().out
    assert str(args.device) == "neuron:0"
    assert args.bf16 is True and "every Trainium generation" in out
    assert args.torch_compile_backend == "neuron" and "torch_compile_backend: 'neuron'" in out
    with pytest.raises(ValueError, match="backend .inductor. cannot compile for a NeuronCore"):
        training.training_arguments(tmp_path, torch.device("neuron", 0), max_steps=3, compile_backend="inductor")


def test_make_trainer_compiles_with_static_shapes(tokenizer, packed, tmp_path):
    args = training.training_arguments(tmp_path, "cpu", max_steps=1, compile_backend="aot_eager", verbose=False)
    collator = data.PaddingCollator(tokenizer.pad_token_id, (16,))
    static = training.make_trainer(tiny_model(tokenizer), args, packed, collator)
    assert training.compile_settings(static) == {"backend": "aot_eager", "mode": "default", "dynamic": False}
    # Without it, Transformers leaves dynamic=None off Neuron: dynamo would go symbolic after two shapes.
    # (new TrainingArguments for each Trainer: the accelerator state they set up is shared)
    args = training.training_arguments(tmp_path, "cpu", max_steps=1, compile_backend="aot_eager", verbose=False)
    default = training.make_trainer(tiny_model(tokenizer), args, packed, collator, static_shapes=False)
    assert training.compile_settings(default)["dynamic"] is None
    eager = training.training_arguments(tmp_path, "cpu", max_steps=1, torch_compile=False, verbose=False)
    assert training.compile_settings(training.make_trainer(tiny_model(tokenizer), eager, packed, collator)) == {}


def _rows_of_distinct_lengths(tokenizer, n):
    rows = data.tokenized_dataset(tokenizer, data.training_texts(200, seed=2), 128)
    by_length = {len(r["input_ids"]): r for r in rows}
    assert len(by_length) >= n
    return [by_length[k] for k in sorted(by_length)[:n]]


def test_recorder_sees_a_graph_per_new_shape_then_none(tokenizer, tmp_path):
    # Batches of one row, every row a different length: every step is a new shape.
    rows = _rows_of_distinct_lengths(tokenizer, 3)
    args = training.training_arguments(tmp_path / "dynamic", "cpu", max_steps=3, batch_size=1,
                                       compile_backend="eager", verbose=False, disable_tqdm=True)
    recorder = training.TrainingRecorder()
    training.make_trainer(tiny_model(tokenizer), args, rows, data.PaddingCollator(tokenizer.pad_token_id),
                          callbacks=[recorder]).train()
    assert [s.step for s in recorder.steps] == [1, 2, 3]
    assert len(recorder.shapes) == 3 and all(s.new_graphs == 1 for s in recorder.steps)
    assert recorder.graphs == 3 and recorder.graphs_after_warmup == 2
    assert recorder.steady_step_seconds is None  # every step compiled
    assert all(s.loss is not None and s.loss > 0 for s in recorder.steps)

    # Fixed length: the first step (warm-up) compiles the one graph, the rest reuse it.
    fixed = data.fixed_length_dataset(tokenizer, data.training_texts(16), 64, max_positions=128)
    args = training.training_arguments(tmp_path / "fixed", "cpu", max_steps=4, batch_size=2,
                                       compile_backend="eager", verbose=False, disable_tqdm=True)
    recorder = training.TrainingRecorder()
    training.make_trainer(tiny_model(tokenizer), args, fixed, data.PaddingCollator(tokenizer.pad_token_id, (64,)),
                          callbacks=[recorder]).train()
    assert recorder.shapes == [(2, 64)]
    assert [s.new_graphs for s in recorder.steps] == [1, 0, 0, 0]
    assert recorder.graphs == 1 and recorder.graphs_after_warmup == 0
    summary = recorder.summary()
    assert summary["steady_step_seconds"] > 0 and summary["real_tokens_per_second"] > 0
    assert summary["padding_waste"] == pytest.approx(1 - sum(s.real_tokens for s in recorder.steps) / (4 * 2 * 64))
    assert 0 < summary["padding_waste"] < 1


def _run(model, rows, collator, output_dir, stop_at=None, resume=None):
    args = training.training_arguments(output_dir, "cpu", max_steps=6, batch_size=2, learning_rate=3e-3,
                                       save_steps=2, verbose=False, disable_tqdm=True,
                                       torch_compile=False)  # resuming does not depend on compiling; keep it fast
    recorder = training.TrainingRecorder()
    callbacks = [recorder] + ([training.StopAtStep(stop_at)] if stop_at else [])
    training.make_trainer(model, args, rows, collator, callbacks=callbacks).train(resume_from_checkpoint=resume)
    return {s.step: s.loss for s in recorder.steps}


def test_resume_continues_the_loss_curve_exactly(tokenizer, packed, tmp_path):
    collator = data.PaddingCollator(tokenizer.pad_token_id, (16,))
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
    with pytest.raises(FileNotFoundError, match=r"no checkpoint-N folder.*save_steps"):
        training.last_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="save_steps"):
        training.last_checkpoint(tmp_path / "missing")


def test_bad_training_inputs(tmp_path):
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        training.training_arguments(tmp_path, "cpu", max_steps=0, verbose=False)
    with pytest.raises(ValueError, match="step must be at least 1"):
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


def test_live_plot_replaces_the_notebook_loss_table(tokenizer, packed, tmp_path, monkeypatch):
    import transformers.trainer
    from transformers.utils.notebook import NotebookProgressCallback

    # What Trainer does when it runs inside Jupyter: its progress callback is the notebook one.
    monkeypatch.setattr(transformers.trainer, "DEFAULT_PROGRESS_CALLBACK", NotebookProgressCallback)
    args = training.training_arguments(tmp_path, "cpu", max_steps=1, verbose=False, torch_compile=False)
    collator = data.PaddingCollator(tokenizer.pad_token_id, (16,))
    plain = training.make_trainer(tiny_model(tokenizer), args, packed, collator)
    assert [type(c) for c in plain.callback_handler.callbacks if isinstance(c, NotebookProgressCallback)] == \
        [NotebookProgressCallback]
    args = training.training_arguments(tmp_path, "cpu", max_steps=1, verbose=False, torch_compile=False)
    with_plot = training.make_trainer(tiny_model(tokenizer), args, packed, collator, callbacks=[training.LiveLossPlot()])
    bars = [c for c in with_plot.callback_handler.callbacks if isinstance(c, NotebookProgressCallback)]
    assert [type(c).__name__ for c in bars] == ["NotebookProgressBar"]
    state = type("State", (), {"global_step": 1, "max_steps": 1})()
    bars[0].on_train_begin(args, state, None)
    bars[0].on_log(args, state, None, logs={"loss": 1.0})
    assert bars[0].training_tracker.inner_table is None  # a bar, and no table of losses under it
