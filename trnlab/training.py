"""What surrounds ``TrainingArguments`` and ``Trainer`` when you train the way the page teaches.

The page's training claims (facts file, 7 to 9): ``TrainingArguments`` finds the Neuron
device and every Trainium generation computes in bf16; ``torch_compile=True`` wraps the model
in ``torch.compile`` with the backend set to ``"neuron"`` automatically; every new input shape
compiles a new graph, so pad to a fixed length and drop the last, short batch.

The page's calls, ``TrainingArguments(output_dir=..., bf16=..., torch_compile=True,
dataloader_drop_last=True, ...)`` and ``Trainer(...).train()``, are written out by the caller
(notebook 04, ``python -m trnlab bench train``). This module supplies what goes around them:

* :func:`precision_choice`: whether to pass ``bf16=True`` on a device, and why;
* :func:`static_shape_compiles`: a ``Trainer`` built inside compiles with ``dynamic=False`` on
  any device, as ``Trainer`` does on Neuron; :func:`compile_settings` shows what it will pass;
* :class:`TrainingRecorder`: loss, step time, batch shape and graphs compiled, per step;
* :class:`LiveLossPlot`: the loss curve, redrawn in place while a notebook trains;
* :class:`StopAtStep` and :func:`last_checkpoint`: interrupt a run and resume it.

``training_arguments``, ``make_trainer`` and ``train_strategy`` hid the page's calls: they are
deprecated (they warn, saying what to write, and keep working until trnlab 0.3).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from trnlab import compat
from trnlab.compile_tracking import CompileTracker, compile_backend as pick_compile_backend, forget_compiled_graphs
from trnlab.device import bf16_supported


def _deprecated(old: str, write: str) -> None:
    import warnings

    warnings.warn(f"trnlab.{old} is deprecated and will be removed in trnlab 0.3: write {write} instead",
                  FutureWarning, stacklevel=3)


#: Names that moved out of this module: ``{old name: (module, new name)}``, still served with a warning.
_MOVED = {"format_table": ("trnlab.plots", "format_table")}


def __getattr__(name: str):
    # PEP 562: `trnlab.training.format_table` keeps working for one release, with a FutureWarning.
    if name in _MOVED:
        import importlib
        import warnings

        module, new = _MOVED[name]
        warnings.warn(f"trnlab.training.{name} is deprecated and will be removed in trnlab 0.3: it moved, "
                      f"write {module}.{new} (or trnlab.{new}) instead", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(module), new)
    raise AttributeError(f"module 'trnlab.training' has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# Arguments and Trainer


def precision_choice(device: torch.device | str) -> tuple[bool, str]:
    """``(bf16, reason)``: whether to train in bf16 on ``device``, and why, in one sentence."""
    backend = torch.device(device).type
    if bf16_supported(backend):
        if backend == "neuron":
            return True, "bf16=True: every Trainium generation computes in bfloat16 natively."
        return True, f"bf16=True: this {backend} device supports bfloat16 natively."
    if backend == "cpu":
        return False, ("bf16=False: on CPU bfloat16 is emulated and slow on most chips (and Transformers "
                       "allows it there only with use_cpu=True), so this run trains in float32; "
                       "on Trainium the same call picks bf16=True.")
    return False, f"bf16=False: this {backend} device has no native bfloat16."


_ARGUMENTS_INSTEAD = (
    'TrainingArguments(output_dir=..., bf16=bf16, torch_compile=True, dataloader_drop_last=True, '
    'use_cpu=device.type == "cpu", max_steps=..., per_device_train_batch_size=..., logging_steps=1, '
    'report_to="none") with `bf16, reason = trnlab.training.precision_choice(device)` '
    '(see notebook 04)')


def training_arguments(output_dir: str | os.PathLike, device: torch.device | str, *,
                       max_steps: int, batch_size: int = 8, learning_rate: float = 1e-3,
                       compile_backend: str | None = None, seed: int = 0,
                       save_steps: int | None = None, verbose: bool = True,
                       **overrides) -> TrainingArguments:
    """Deprecated: write ``TrainingArguments(...)`` yourself (notebook 04 shows the page's call).

    Builds ``TrainingArguments`` with ``bf16`` from :func:`precision_choice`,
    ``torch_compile=True`` (backend ``compile_backend``, ``None``: Transformers' pick),
    ``dataloader_drop_last=True``, ``use_cpu`` on CPU, a constant learning rate, the loss
    logged every step and a checkpoint every ``save_steps`` steps; ``overrides`` go last.
    """
    _deprecated("training_arguments", _ARGUMENTS_INSTEAD)
    return _page_arguments(output_dir, device, max_steps=max_steps, batch_size=batch_size,
                           learning_rate=learning_rate, compile_backend=compile_backend, seed=seed,
                           save_steps=save_steps, verbose=verbose, **overrides)


def _page_arguments(output_dir, device, *, max_steps: int, batch_size: int = 8, learning_rate: float = 1e-3,
                    compile_backend: str | None = None, seed: int = 0, save_steps: int | None = None,
                    verbose: bool = False, **overrides) -> TrainingArguments:
    # What the deprecated training_arguments() builds (kept for its callers until trnlab 0.3).
    device = torch.device(device)
    bf16, reason = precision_choice(device)
    if compile_backend is not None:
        compile_backend = pick_compile_backend(device, compile_backend)  # checks it fits the device
    if device.type == "neuron" and compile_backend == "neuron":
        compile_backend = None  # let Transformers pick it, as the page teaches (claim 8)
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    kwargs = dict(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        bf16=bf16, use_cpu=device.type == "cpu",
        torch_compile=True, torch_compile_backend=compile_backend,
        dataloader_drop_last=True, dataloader_num_workers=0,
        seed=seed, data_seed=seed, logging_steps=1, report_to="none",
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        include_num_input_tokens_seen="non_padding",
    )
    kwargs.update(overrides)
    if kwargs.get("disable_tqdm") is None:
        # Transformers' own default, decided here because _quiet_transformers() would flip it.
        from transformers.utils import logging

        kwargs["disable_tqdm"] = logging.get_verbosity() > logging.WARNING
    with _quiet_transformers():
        args = TrainingArguments(**kwargs)
    if verbose:
        print(reason)
        print(describe_arguments(args))
    return args


def describe_arguments(args: TrainingArguments) -> str:
    """The fields of ``args`` the page talks about, one per line (device, bf16, compile backend...)."""
    backend = args.torch_compile_backend
    lines = [
        f"device:                {args.device}",
        f"bf16:                  {args.bf16}",
        f"torch_compile:         {args.torch_compile}",
        f"torch_compile_backend: {backend!r}  (picked by Transformers unless set)",
        f"dataloader_drop_last:  {args.dataloader_drop_last}",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def _quiet_transformers():
    # TrainingArguments warns "the speedups for torchdynamo mostly come with GPU Ampere" on any
    # machine without a GPU, Trainium included: misleading in this course, so silenced here only.
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


@contextlib.contextmanager
def _env(name: str, value: str | None):
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


#: Accelerate's variable for ``torch.compile(dynamic=...)`` when nothing else sets it.
STATIC_SHAPES_ENV_VAR = compat.ACCELERATE_DYNAMIC_ENV_VAR


@contextlib.contextmanager
def static_shape_compiles():
    """Inside the block, a ``Trainer`` built compiles with ``dynamic=False`` on any device, as on Neuron.

    On Neuron, ``Trainer`` passes ``dynamic=False`` to ``torch.compile`` itself (the Neuron
    backend rejects dynamic shapes), so every new shape compiles a new graph. Elsewhere it
    passes ``dynamic=None`` and Accelerate reads ``ACCELERATE_DYNAMO_USE_DYNAMIC``; unset, dynamo
    makes a changing length symbolic after the second shape and hides the recompiles Trainium
    does. The block sets that variable to ``false`` (restored after). A notebook sets it for
    its whole process in one visible line instead (notebook 04).
    """
    with _env(STATIC_SHAPES_ENV_VAR, "false"):
        yield


def make_trainer(model, args: TrainingArguments, train_dataset, data_collator, *,
                 callbacks: Sequence[TrainerCallback] = (), static_shapes: bool = True,
                 **trainer_kwargs) -> Trainer:
    """Deprecated: write ``Trainer(...)`` yourself (notebook 04 shows how).

    Builds the ``Trainer`` (inside :func:`static_shape_compiles` when ``static_shapes``), routes
    the collator through a :class:`TrainingRecorder` in ``callbacks``, and keeps the printing of
    every log line (``disable_tqdm``) and the notebook table of losses (with a
    :class:`LiveLossPlot`) out of the output.
    """
    _deprecated("make_trainer",
                'os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "false" (static shapes off Trainium), then '
                "Trainer(model=model, args=args, train_dataset=dataset, data_collator=recorder.watch(collator), "
                "callbacks=[recorder, ...]) and trainer.remove_callback(transformers.PrinterCallback)")
    return _build_trainer(model, args, train_dataset, data_collator, callbacks=callbacks,
                          static_shapes=static_shapes, **trainer_kwargs)


def _build_trainer(model, args, train_dataset, data_collator, *, callbacks=(), static_shapes=True, **trainer_kwargs):
    for callback in callbacks:
        if isinstance(callback, TrainingRecorder):
            data_collator = callback.watch(data_collator)
    with _env(STATIC_SHAPES_ENV_VAR, "false" if static_shapes and args.torch_compile else None):
        trainer = Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator,
                          callbacks=list(callbacks), **trainer_kwargs)
    if args.disable_tqdm and any(isinstance(c, TrainingRecorder) for c in callbacks):
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # it would print every log dict; the recorder keeps them
    if any(isinstance(c, LiveLossPlot) for c in callbacks):
        _progress_bar_without_loss_table(trainer)
    return trainer


def _progress_bar_without_loss_table(trainer: Trainer) -> None:
    # In Jupyter, Trainer shows an HTML progress bar and under it a table with one row per logged
    # loss: with logging_steps=1 that table grows by a row a step. The live plot shows the losses.
    default = compat.notebook_progress_callback_class()
    if default.__name__ != "NotebookProgressCallback":
        return

    class NotebookProgressBar(default):
        """Trainer's notebook progress bar, without its table of logged losses."""

        def on_train_begin(self, args, state, control, **kwargs):
            super().on_train_begin(args, state, control, **kwargs)
            compat.hide_progress_table(self)

        def on_log(self, args, state, control, logs=None, **kwargs):
            return None

    if trainer.pop_callback(default) is not None:
        trainer.add_callback(NotebookProgressBar)


def compile_settings(trainer: Trainer) -> dict:
    """The keyword arguments the Trainer will give ``torch.compile`` (empty if it does not compile)."""
    plugin = compat.trainer_dynamo_plugin(trainer)
    if str(plugin.backend.value).lower() == "no":
        return {}
    return {"backend": plugin.backend.value.lower(), "mode": plugin.mode, "dynamic": plugin.dynamic}


# ---------------------------------------------------------------------------------------------
# Recording what happens per step


@dataclass
class StepRecord:
    """One optimizer step: loss, wall seconds, batch shape, tokens, graphs compiled."""

    step: int
    loss: float | None
    seconds: float
    shape: tuple[int, ...] | None
    real_tokens: int | None
    tokens: int | None
    new_graphs: int
    graphs_so_far: int
    compile_seconds_so_far: float


class _WatchedCollator:
    """Calls ``collator`` and hands each batch's shape and token counts to ``recorder``."""

    def __init__(self, collator, recorder: TrainingRecorder):
        self.collator, self.recorder = collator, recorder

    def __call__(self, rows):
        batch = self.collator(rows)
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        self.recorder._batches.append((tuple(batch["input_ids"].shape), real, batch["input_ids"].numel()))
        return batch


@dataclass
class TrainingRecorder(TrainerCallback):
    """Callback: per step, the loss, step time, batch shape and graphs compiled so far.

    Graphs are counted with :class:`~trnlab.compile_tracking.CompileTracker` from the start of
    ``train()``. *Warm-up* is the first ``warmup_steps`` optimizer steps (default 1: the first
    step captures and compiles the forward; the optimizer step runs eager). With dynamo's
    ``eager`` backend the backward is ordinary autograd; backends built on AOTAutograd
    (``aot_eager``, ``inductor``) compile a backward graph too. :attr:`graphs_after_warmup`
    counts graphs compiled after warm-up: 0 for a static-shape run, one per new shape with
    dynamic padding. Pass it in ``callbacks`` and the collator as
    ``data_collator=recorder.watch(collator)``, so each step also knows its batch shape.
    """

    warmup_steps: int = 1
    steps: list[StepRecord] = field(default_factory=list)
    tracker: CompileTracker = field(default_factory=CompileTracker)
    _batches: list = field(default_factory=list, repr=False)
    _step_start: float = 0.0
    _graphs_at_step_start: int = 0

    def watch(self, collator):
        """``collator``, wrapped so this recorder sees the shape and real tokens of every batch it builds."""
        return collator if isinstance(collator, _WatchedCollator) else _WatchedCollator(collator, self)

    # -- TrainerCallback hooks
    def on_train_begin(self, args, state, control, **kwargs):
        self.steps.clear()
        self._batches.clear()
        self.tracker.__enter__()

    def on_step_begin(self, args, state, control, **kwargs):
        self._graphs_at_step_start = self.tracker.graphs
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self._step_start
        graphs = self.tracker.graphs
        # Optimizer step i trains on micro-batches i*G .. (i+1)*G - 1 (G: gradient accumulation
        # steps). Matched by position, not by "batches seen so far": the data loader may have
        # collated the next step's first batch already.
        per_step = max(1, args.gradient_accumulation_steps)
        i = len(self.steps)
        mine = self._batches[i * per_step:(i + 1) * per_step]
        if mine:
            shape = mine[0][0] if len({b[0] for b in mine}) == 1 else max(b[0] for b in mine)
            real, tokens = sum(b[1] for b in mine), sum(b[2] for b in mine)
        else:
            shape, real, tokens = None, None, None
        self.steps.append(StepRecord(state.global_step, None, seconds, shape, real, tokens,
                                     graphs - self._graphs_at_step_start, graphs, self.tracker.compile_seconds))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self.steps and self.steps[-1].step == state.global_step:
            self.steps[-1].loss = float(logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self.tracker.__exit__(None, None, None)

    # -- results
    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps if s.loss is not None]

    @property
    def graphs(self) -> int:
        """Graphs compiled during training."""
        return self.tracker.graphs

    @property
    def graphs_after_warmup(self) -> int:
        """Graphs compiled after the first ``warmup_steps`` steps."""
        return sum(s.new_graphs for s in self.steps[self.warmup_steps:])

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Distinct batch shapes, in order of first appearance."""
        return list(dict.fromkeys(s.shape for s in self.steps if s.shape is not None))

    def _steady(self) -> list[StepRecord]:
        return [s for s in self.steps[self.warmup_steps:] if s.new_graphs == 0]

    @property
    def steady_step_seconds(self) -> float | None:
        """Median time of the steps after warm-up that compiled nothing (``None`` if none)."""
        steady = self._steady()
        return statistics.median(s.seconds for s in steady) if steady else None

    @property
    def padding_waste(self) -> float | None:
        """Fraction of pad tokens over all batches trained on."""
        counted = [s for s in self.steps if s.tokens]
        return 1 - sum(s.real_tokens for s in counted) / sum(s.tokens for s in counted) if counted else None

    @property
    def real_tokens_per_second(self) -> float | None:
        """Non-pad tokens per second over the steady steps (compiling steps excluded)."""
        steady = [s for s in self._steady() if s.real_tokens is not None]
        seconds = sum(s.seconds for s in steady)
        return sum(s.real_tokens for s in steady) / seconds if steady and seconds > 0 else None

    @property
    def total_seconds(self) -> float:
        """Wall seconds of all steps (compiling ones included)."""
        return sum(s.seconds for s in self.steps)

    @property
    def compiling_step_seconds(self) -> float:
        """Wall seconds of the steps that compiled a graph.

        Dynamo's compile time (``compile_seconds``) covers capturing the forward and handing it
        to the backend; the rest of a compiling step (its first backward, the optimizer step,
        and a backward graph an AOTAutograd-based backend compiles lazily) is in this figure.
        """
        return sum(s.seconds for s in self.steps if s.new_graphs)

    @property
    def real_tokens_per_second_overall(self) -> float | None:
        """Non-pad tokens per second over all steps, compiling ones included."""
        counted = [s for s in self.steps if s.real_tokens is not None]
        seconds = sum(s.seconds for s in counted)
        return sum(s.real_tokens for s in counted) / seconds if counted and seconds > 0 else None

    def summary(self) -> dict:
        """The figures notebook 04's table and the benchmark report, as a dict."""
        return {
            "steps": len(self.steps),
            "shapes": len(self.shapes),
            "graphs": self.graphs,
            "graphs_after_warmup": self.graphs_after_warmup,
            "recompile_limit_hits": self.tracker.recompile_limit_hits,
            "compile_seconds": self.tracker.compile_seconds,
            "compiling_step_seconds": self.compiling_step_seconds,
            "steady_step_seconds": self.steady_step_seconds,
            "padding_waste": self.padding_waste,
            "real_tokens_per_second": self.real_tokens_per_second,
            "real_tokens_per_second_overall": self.real_tokens_per_second_overall,
            "final_loss": self.losses[-1] if self.losses else None,
            "total_seconds": self.total_seconds,
        }

    def table(self) -> list[dict]:
        """One dict per step (for printing or plotting)."""
        return [dict(s.__dict__) for s in self.steps]


class StopAtStep(TrainerCallback):
    """Stop training after optimizer step ``step``, as if the machine went away there.

    Notebook 04 and the resume test use it to interrupt a run between two checkpoints.
    """

    def __init__(self, step: int):
        if step < 1:
            raise ValueError(f"step must be at least 1, got {step}")
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def last_checkpoint(output_dir: str | os.PathLike) -> str:
    """The newest ``checkpoint-N`` folder in ``output_dir``, for ``train(resume_from_checkpoint=...)``.

    Raises ``FileNotFoundError`` saying how to get checkpoints when there is none.
    """
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(output_dir)) if os.path.isdir(output_dir) else None
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint-N folder in {output_dir}: train with save_steps set "
            '(TrainingArguments(..., save_strategy="steps", save_steps=N)) so there is one to resume from')
    return found


# ---------------------------------------------------------------------------------------------
# Plots


def _figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return buffer.getvalue()


class LiveLossPlot(TrainerCallback):
    """Callback: a loss curve that redraws in place while a notebook trains.

    It shows one image through an IPython display handle and updates it every ``every``
    steps, with a dotted line at each step that compiled a graph. It renders to PNG itself,
    so it works the same in JupyterLab and under nbconvert/nbval; outside IPython it draws
    nothing. ``reference`` (``{step: loss}``) is drawn dashed behind, e.g. an earlier run.
    """

    def __init__(self, title: str = "training loss", every: int = 1,
                 reference: Mapping[int, float] | None = None, reference_label: str = "reference"):
        self.title, self.every = title, max(1, every)
        self.reference, self.reference_label = dict(reference or {}), reference_label
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.compiled_steps: list[int] = []
        self._handle = None
        self._graphs = 0

    def _display(self):
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return None
        if get_ipython() is None:
            return None
        return display(Image(data=self._render()), display_id=True)

    def _render(self) -> bytes:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 3))
        ax = fig.add_subplot()
        if self.reference:
            ax.plot(list(self.reference), list(self.reference.values()), "--", color="grey",
                    label=self.reference_label)
        from trnlab.plots import draw_loss_curve

        draw_loss_curve(ax, self.steps, self.losses, self.compiled_steps, label="this run")
        ax.set_title(f"{self.title} (dotted: a graph was compiled)", fontsize=10)
        if self.reference:
            ax.legend(fontsize=8)
        return _figure_png(fig)

    def on_train_begin(self, args, state, control, **kwargs):
        from trnlab.compile_tracking import graphs_compiled

        self._graphs = graphs_compiled()
        self._handle = self._display()

    def on_step_end(self, args, state, control, **kwargs):
        from trnlab.compile_tracking import graphs_compiled

        now = graphs_compiled()
        if now > self._graphs:
            self.compiled_steps.append(state.global_step)
        self._graphs = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        self.steps.append(state.global_step)
        self.losses.append(float(logs["loss"]))
        if self._handle is not None and len(self.steps) % self.every == 0:
            from IPython.display import Image

            self._handle.update(Image(data=self._render()))

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            from IPython.display import Image

            self._handle.update(Image(data=self._render()))


# ---------------------------------------------------------------------------------------------
# One strategy, end to end (notebook 04 and the benchmark)


def train_strategy(strategy: str, model, tokenizer, texts: Sequence[str], output_dir, device, *,
                   length: int, max_steps: int, batch_size: int = 4, learning_rate: float = 2e-3,
                   compile_backend: str | None = None, seed: int = 0, callbacks: Sequence[TrainerCallback] = (),
                   cold_start: bool = True, resume_from_checkpoint: str | None = None, verbose: bool = False,
                   **argument_overrides):
    """Deprecated: write ``strategy_dataset``, ``TrainingArguments`` and ``Trainer`` yourself (notebook 04).

    Shapes ``texts`` with :func:`trnlab.data.strategy_dataset` and fine-tunes ``model`` on them;
    returns ``(trainer, recorder)``.

    With ``cold_start`` the graphs compiled in this process are forgotten first
    (:func:`trnlab.forget_compiled_graphs`); on Trainium the NEFF cache on disk stays warm, so
    neuronx-cc is not run again for a graph it compiled before.
    """
    _deprecated("train_strategy",
                "dataset, collator = trnlab.data.strategy_dataset(strategy, tokenizer, texts, length), then "
                "TrainingArguments(output_dir=..., bf16=..., torch_compile=True, dataloader_drop_last=True, ...) "
                "and Trainer(model=model, args=args, train_dataset=dataset, "
                "data_collator=recorder.watch(collator), callbacks=[recorder]).train() (see notebook 04)")
    from trnlab.data import strategy_dataset

    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    dataset, collator = strategy_dataset(strategy, tokenizer, texts, length, max_positions=max_positions)
    args = _page_arguments(output_dir, device, max_steps=max_steps, batch_size=batch_size,
                           learning_rate=learning_rate, compile_backend=compile_backend, seed=seed,
                           verbose=verbose, **argument_overrides)
    recorder = TrainingRecorder()
    if cold_start:
        forget_compiled_graphs()
    trainer = _build_trainer(model, args, dataset, collator, callbacks=[recorder, *callbacks])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer, recorder
