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
* :func:`page_arguments`: the page's ``TrainingArguments`` call with the course's choices, the
  one way the package builds them (the deprecated :func:`training_arguments` and
  ``python -m trnlab bench train``); notebooks write the call out instead;
* :func:`last_checkpoint`: the checkpoint to resume from.

The callbacks that go with them (:class:`~trnlab.callbacks.TrainingRecorder`,
:class:`~trnlab.callbacks.LiveLossPlot`, :class:`~trnlab.callbacks.StopAtStep`) are in
:mod:`trnlab.callbacks`, and still importable from here.

``training_arguments``, ``make_trainer`` and ``train_strategy`` hid the page's calls: they are
deprecated (they warn, saying what to write, and keep working until trnlab 0.3).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from trnlab import compat
from trnlab.callbacks import LiveLossPlot, StepRecord, StopAtStep, TrainingRecorder  # noqa: F401 (their old path)
from trnlab.compile_tracking import compile_backend as pick_compile_backend, forget_compiled_graphs
from trnlab.data import strategy_dataset
from trnlab.deprecation import moved_names, warn_deprecated as _deprecated
from trnlab.device import bf16_supported
from trnlab.settings import environment, quiet_transformers

__all__ = [
    "STATIC_SHAPES_ENV_VAR", "compile_settings", "describe_arguments", "last_checkpoint", "page_arguments",
    "precision_choice", "static_shape_compiles",
]


#: Names that moved out of this module, still served with a warning (removed in trnlab 0.3).
__getattr__ = moved_names("trnlab.training", {
    "format_table": ("trnlab.plots", "trnlab.plots.format_table (or trnlab.format_table)")})


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
    return page_arguments(output_dir, device, max_steps=max_steps, batch_size=batch_size,
                          learning_rate=learning_rate, compile_backend=compile_backend, seed=seed,
                          save_steps=save_steps, verbose=verbose, **overrides)


def page_arguments(output_dir: str | os.PathLike, device: torch.device | str, *, max_steps: int,
                   batch_size: int = 8, learning_rate: float = 1e-3, compile_backend: str | None = None,
                   seed: int = 0, save_steps: int | None = None, verbose: bool = False,
                   **overrides) -> TrainingArguments:
    """The page's ``TrainingArguments(output_dir=..., bf16=..., torch_compile=True, dataloader_drop_last=True, ...)``.

    The one place trnlab builds them (the deprecated :func:`training_arguments`, ``python -m
    trnlab bench train``): ``bf16`` from :func:`precision_choice`, ``torch_compile=True``
    (backend ``compile_backend``; ``None``, or ``"neuron"`` on Neuron: Transformers' pick),
    ``dataloader_drop_last=True``, ``use_cpu`` on CPU, a constant learning rate, the loss logged
    every step, a checkpoint every ``save_steps`` steps (``None``: none); ``overrides`` go last.
    ``verbose`` prints the bf16 reason and :func:`describe_arguments`. Notebooks write the call out.
    """
    device = torch.device(device)
    bf16, reason = precision_choice(device)
    backend = _backend_to_pass(device, compile_backend)
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    kwargs = dict(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        bf16=bf16, use_cpu=device.type == "cpu",
        torch_compile=True, torch_compile_backend=backend,
        dataloader_drop_last=True, dataloader_num_workers=0,
        seed=seed, data_seed=seed, logging_steps=1, report_to="none",
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        include_num_input_tokens_seen="non_padding",
    )
    kwargs.update(overrides)
    if kwargs.get("disable_tqdm") is None:
        # Transformers' own default, decided here because quiet_transformers() would flip it.
        from transformers.utils import logging

        kwargs["disable_tqdm"] = logging.get_verbosity() > logging.WARNING
    with quiet_transformers():  # no "speedups for torchdynamo mostly come with GPU Ampere" on CPU or Trainium
        args = TrainingArguments(**kwargs)
    if verbose:
        print(reason)
        print(describe_arguments(args))
    return args


def _backend_to_pass(device: torch.device, compile_backend: str | None) -> str | None:
    # The torch_compile_backend to give TrainingArguments: checked against the device, and None
    # for "neuron" on Neuron, where Transformers picks it itself, as the page teaches (claim 8).
    if compile_backend is None:
        return None
    compile_backend = pick_compile_backend(device, compile_backend)  # raises if it does not fit the device
    return None if device.type == "neuron" and compile_backend == "neuron" else compile_backend


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
    with environment(**{STATIC_SHAPES_ENV_VAR: "false"}):
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
    static = static_shapes and args.torch_compile
    with static_shape_compiles() if static else contextlib.nullcontext():
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
# Resuming


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
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    dataset, collator = strategy_dataset(strategy, tokenizer, texts, length, max_positions=max_positions)
    args = page_arguments(output_dir, device, max_steps=max_steps, batch_size=batch_size,
                           learning_rate=learning_rate, compile_backend=compile_backend, seed=seed,
                           verbose=verbose, **argument_overrides)
    recorder = TrainingRecorder()
    if cold_start:
        forget_compiled_graphs()
    trainer = _build_trainer(model, args, dataset, collator, callbacks=[recorder, *callbacks])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer, recorder
