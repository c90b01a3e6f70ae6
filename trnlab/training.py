"""What surrounds ``TrainingArguments`` and ``Trainer`` when you train the way the page teaches (claims 7 to 9).
The caller writes the page's calls out; this module supplies the ``bf16`` choice, static-shape compiles off Neuron,
the one ``TrainingArguments`` builder and the checkpoint to resume from. The callbacks are in :mod:`trnlab.callbacks`."""

from __future__ import annotations

import contextlib
import os

import torch
from transformers import Trainer, TrainingArguments

from trnlab import compat
from trnlab.callbacks import LiveLossPlot, StepRecord, StopAtStep, TrainingRecorder  # noqa: F401 (their old path)
from trnlab.compile_tracking import compile_backend as pick_compile_backend
from trnlab.device import bf16_supported
from trnlab.settings import environment, quiet_transformers

__all__ = [
    "STATIC_SHAPES_ENV_VAR", "compile_settings", "describe_arguments", "last_checkpoint", "page_arguments",
    "precision_choice", "static_shape_compiles",
]


# Arguments and Trainer


def precision_choice(device: torch.device | str, weights=None) -> tuple[bool, str]:
    """``(bf16, reason)``: whether to pass ``bf16=True`` on ``device``, and why, for ``weights`` (the model or its dtype).
    ``bf16`` is Accelerate's mixed precision: it does not cast the weights, so the run trains in their loaded dtype."""
    backend = torch.device(device).type
    dtype = getattr(weights, "dtype", weights)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"weights must be the loaded model or its torch dtype (e.g. model.dtype), got {weights!r}")
    name = str(dtype).removeprefix("torch.")
    if bf16_supported(backend):
        why = ("every Trainium generation computes in bfloat16 natively" if backend == "neuron"
               else f"this {backend} device supports bfloat16 natively")
        held = "" if dtype is None else f"; the {name} weights stay {name} (bf16=True is mixed precision)"
        return True, f"bf16=True: {why}{held}."
    if backend == "cpu":
        why = "bf16=False: trnlab passes bf16=True only where the device computes bfloat16 natively, not on a CPU"
    else:
        why = f"bf16=False: this {backend} device has no native bfloat16"
    trains = ("the dtype the weights were loaded in (pass the model to name it)" if dtype is None
              else f"{name}, the dtype the weights were loaded in")
    elsewhere = "; on Trainium the same call picks bf16=True" if backend == "cpu" else ""
    return False, f"{why}, so this run trains in {trains}{elsewhere}."


def page_arguments(output_dir: str | os.PathLike, device: torch.device | str, *, max_steps: int,
                   batch_size: int = 8, learning_rate: float = 1e-3, compile_backend: str | None = None,
                   seed: int = 0, save_steps: int | None = None, verbose: bool = False,
                   **overrides) -> TrainingArguments:
    """The page's ``TrainingArguments(output_dir=..., bf16=..., torch_compile=True, dataloader_drop_last=True, ...)``.
    The one place trnlab builds them: ``bf16`` from :func:`precision_choice`, backend ``compile_backend`` (``None``:
    Transformers' pick), constant rate, loss logged each step, a checkpoint every ``save_steps``; ``overrides`` last."""
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
    Off Neuron ``Trainer`` passes ``dynamic=None`` and dynamo would make a changing length symbolic, hiding the
    recompiles Trainium does; the block sets ``ACCELERATE_DYNAMO_USE_DYNAMIC=false`` (restored after)."""
    with environment(**{STATIC_SHAPES_ENV_VAR: "false"}):
        yield


def compile_settings(trainer: Trainer) -> dict:
    """The keyword arguments the Trainer will give ``torch.compile`` (empty if it does not compile)."""
    plugin = compat.trainer_dynamo_plugin(trainer)
    if str(plugin.backend.value).lower() == "no":
        return {}
    return {"backend": plugin.backend.value.lower(), "mode": plugin.mode, "dynamic": plugin.dynamic}


# Resuming


def last_checkpoint(output_dir: str | os.PathLike) -> str:
    """The newest ``checkpoint-N`` folder in ``output_dir``, for ``train(resume_from_checkpoint=...)``.
    Raises ``FileNotFoundError`` saying how to get checkpoints when there is none."""
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(output_dir)) if os.path.isdir(output_dir) else None
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint-N folder in {output_dir}: train with save_steps set "
            '(TrainingArguments(..., save_strategy="steps", save_steps=N)) so there is one to resume from')
    return found

