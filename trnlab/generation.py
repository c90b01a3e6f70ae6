"""Generation on an explicit device, and generation through shape buckets.
Prompts: a string, a list of strings, or token ids (:func:`prompt_token_ids`). With a static cache ``generate()``
compiles the decode step; the prefill runs eagerly unless ``prefill_chunk_size`` is set (Transformers 5.24)."""

from __future__ import annotations

import copy
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence, Union

import torch

from trnlab import compat
from trnlab.buckets import ShapeBuckets, bucket_for
from trnlab.compile_tracking import generation_compile_config
from trnlab.settings import environment

__all__ = [
    "Prompts", "TensorInfo", "bucketed_generate", "first_sentence", "format_forward_calls", "generate_batch",
    "generate_compile_kwargs", "moved_to_model_device", "pad_token_lists", "prompt_token_ids", "record_forward_inputs",
    "show_padding", "static_cache_notice", "tokenize_batch", "will_auto_compile",
]

#: What every prompt argument accepts: one string, strings, or token ids (see :func:`prompt_token_ids`).
Prompts = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]], torch.Tensor]


# Prompts in one form


def prompt_token_ids(prompts: Prompts, tokenizer=None) -> list[list[int]]:
    """Token ids of each prompt: ``prompts`` in any accepted form, as a list of id lists.
    Forms: ``"text"`` or ``["text", ...]`` (need ``tokenizer``), ``[id, ...]``, ``[[id, ...], ...]``, a 1-D or 2-D tensor.
    An empty input or prompt, or a mix of forms, raises ``ValueError`` (other types ``TypeError``)."""
    forms = ("a string, a list of strings, or token ids (a list of ints, or a list of such lists)")
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() not in (1, 2) or prompts.dtype.is_floating_point:
            raise TypeError(f"a prompt tensor holds integer token ids in 1 or 2 dimensions, got "
                            f"{prompts.dim()}-D {prompts.dtype}")
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    elif isinstance(prompts, str):
        prompts = [prompts]
    elif isinstance(prompts, (bytes, dict)) or not isinstance(prompts, Sequence):
        if isinstance(prompts, dict) and "input_ids" in prompts:
            raise TypeError("got a tokenized batch (a dict with input_ids): pass the prompts themselves "
                            f"({forms}), or call model.generate(**batch) directly")
        raise TypeError(f"prompts must be {forms}; got {type(prompts).__name__}")
    elif prompts and all(_is_token_id(p) for p in prompts):
        prompts = [list(prompts)]
    prompts = list(prompts)
    if not prompts:
        raise ValueError(f"no prompts given (an empty list): pass {forms}")
    if all(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer: pass tokenizer=trnlab.load_tokenizer(...), "
                             "or pass token ids")
        ids = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    elif all(isinstance(p, (Sequence, torch.Tensor)) and not isinstance(p, str) for p in prompts):
        ids = [p.tolist() if isinstance(p, torch.Tensor) else list(p) for p in prompts]
        ids = [row[0] if len(row) == 1 and isinstance(row[0], list) else row for row in ids]  # (1, n) tensors
        bad = [row for row in ids if not all(_is_token_id(i) for i in row)]
        if bad:
            raise TypeError(f"token ids must be non-negative ints, got {bad[0][:8]!r}: pass {forms}")
        ids = [[int(i) for i in row] for row in ids]
    else:
        raise TypeError(f"prompts mix strings and token ids: pass {forms}, one form at a time")
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty (no tokens): every prompt needs at least one token")
    return ids


def _is_token_id(value) -> bool:
    try:
        return not isinstance(value, bool) and int(value) == value and int(value) >= 0 \
            and not isinstance(value, (str, float))
    except (TypeError, ValueError):
        return False


def pad_token_lists(token_lists: Sequence[Sequence[int]], pad_token_id: int, padding_side: str = "left",
                    length: int | None = None) -> dict[str, torch.Tensor]:
    """Stack id lists into ``input_ids`` and ``attention_mask`` tensors, padded on ``padding_side``.
    Rows are padded with ``pad_token_id`` (mask 0) up to the longest row, or to ``length``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    if pad_token_id is None:
        raise ValueError("no pad token id: set tokenizer.pad_token = tokenizer.eos_token (padding is masked "
                         "out by the attention mask), or pass pad_token_id=")
    longest = max(len(row) for row in token_lists)
    length = longest if length is None else length
    if length < longest:
        raise ValueError(f"cannot pad a prompt of {longest} tokens down to {length}")
    ids = torch.full((len(token_lists), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), length), dtype=torch.long)
    for i, row in enumerate(token_lists):
        span = slice(length - len(row), length) if padding_side == "left" else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return {"input_ids": ids, "attention_mask": mask}


# Notebook 02: what generate() hands the model


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lived and its shape, as the model's ``forward`` received it."""

    device: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.device} {tuple(self.shape)}"

    __repr__ = __str__


def _describe_argument(value):
    if isinstance(value, dict):  # e.g. the attention masks of each layer type
        return {key: None if item is None else _describe_argument(item) for key, item in value.items()}
    if isinstance(value, torch.Tensor):
        return TensorInfo(str(value.device), tuple(value.shape))
    layers = getattr(value, "layers", None)
    if layers is None:
        return repr(value)
    # a transformers Cache: say where its key tensors live (they are allocated on first use)
    keys = [getattr(layer, "keys", None) for layer in layers]
    devices = sorted({str(k.device) for k in keys if isinstance(k, torch.Tensor)})
    return f"{type(value).__name__} on {', '.join(devices) or 'nothing yet (allocated on first use)'}"


@contextmanager
def record_forward_inputs(model):
    """Record what every ``model.forward`` call inside the block receives.
    Yields a list of dicts, one per call: argument name to :class:`TensorInfo` (device, shape), else a short text.
    Use it on eager generation: a compiled forward would trace the hook into its graph."""
    calls: list[dict] = []

    def hook(module, args, kwargs):
        seen = {f"arg{i}": value for i, value in enumerate(args)} | kwargs
        calls.append({name: _describe_argument(value) for name, value in seen.items()
                      if value is not None and not isinstance(value, bool)})

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def format_forward_calls(calls: Sequence[dict], first: int = 3) -> str:
    """The first ``first`` recorded forward calls, one line each: ``name: device (shape)``."""
    lines = []
    for i, call in enumerate(calls[:first]):
        step = "prefill" if i == 0 else f"decode {i}"
        lines.append(f"forward {i} ({step}): " + ", ".join(f"{k}: {v}" for k, v in call.items()))
    if len(calls) > first:
        lines.append(f"... {len(calls) - first} more forward call(s) like 'decode 1'")
    return "\n".join(lines)


def moved_to_model_device(calls: Sequence[dict], inputs_device: str | torch.device) -> list[str]:
    """Names of the tensor arguments that reached ``forward`` on another device than the inputs'."""
    inputs_device = str(torch.device(inputs_device))
    moved = set()
    for call in calls:
        for name, info in call.items():
            items = info.items() if isinstance(info, dict) else [(None, info)]
            moved |= {f"{name}[{key!r}]" if key else name for key, item in items
                      if isinstance(item, TensorInfo) and item.device != inputs_device}
    return sorted(moved)


def tokenize_batch(tokenizer, prompts: Prompts, padding_side: str = "left") -> dict:
    """Tokenize ``prompts`` (any form, see :func:`prompt_token_ids`) as one padded batch on CPU.
    Returns ``input_ids`` and ``attention_mask``, padded on ``padding_side`` with the tokenizer's pad token."""
    ids = prompt_token_ids(prompts, tokenizer)
    return pad_token_lists(ids, tokenizer.pad_token_id, padding_side)


def show_padding(tokenizer, batch: dict, pad_symbol: str = "_") -> str:
    """One line per row of a tokenized batch: its attention mask, then its tokens (pads drawn as ``pad_symbol``)."""
    lines = []
    for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
        text = "".join(pad_symbol if m == 0 else tokenizer.decode([i]) for i, m in zip(ids, mask))
        lines.append(f"mask {''.join(map(str, mask))} | {text}")
    return "\n".join(lines)


def generate_batch(model, tokenizer, prompts: Prompts, padding_side: str = "left",
                   use_attention_mask: bool = True, **generate_kwargs) -> list[str]:
    """Generate for ``prompts`` as one padded batch; return each decoded continuation.
    Inputs stay on CPU (``generate()`` moves what the forward needs, claim 4). ``padding_side`` and
    ``use_attention_mask`` exist to show what goes wrong without them: keep the defaults in real code."""
    batch = tokenize_batch(tokenizer, prompts, padding_side)
    inputs = {"input_ids": batch["input_ids"]}
    if use_attention_mask:
        inputs["attention_mask"] = batch["attention_mask"]
    generate_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    notice = static_cache_notice(model, **generate_kwargs)
    if notice:
        warnings.warn(notice, UserWarning, stacklevel=2)
    output = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def first_sentence(text: str) -> str:
    """``text`` up to and including its first ``.``, ``!`` or ``?`` (all of it if it has none), stripped.
    Greedy float32 and bfloat16 continuations can part later on (bf16 rounding); the first sentence is what must agree."""
    text = text.strip()
    ends = [i for i in (text.find(mark) for mark in ".!?") if i >= 0]
    return text[: min(ends) + 1] if ends else text


# Notebook 03: generation through shape buckets


def generate_compile_kwargs(model, compile: bool = True, backend: str | None = None,
                            compile_prefill: bool = False) -> dict:
    """The ``generate()`` keyword arguments that turn compilation off, or on the Neuron way.
    ``compile=False`` gives ``disable_compile=True`` (claim 6); else :func:`trnlab.generation_compile_config`, and with
    ``compile_prefill`` a ``prefill_chunk_size`` that sends the whole prompt through the compiled forward."""
    if not compile:
        return {"disable_compile": True}
    kwargs = {}
    config = generation_compile_config(model.device, backend)
    if config is not None:
        kwargs["compile_config"] = config
    if compile_prefill:
        # One chunk as long as any prompt: the whole prefill goes through the compiled forward.
        kwargs["prefill_chunk_size"] = model.config.max_position_embeddings
    return kwargs



def will_auto_compile(model, **generate_kwargs) -> bool:
    """Whether ``model.generate(**generate_kwargs)`` compiles its forward by itself: Transformers' own rule, asked.
    Yes with a static cache on cuda, xpu, neuron or tpu, or with a ``compile_config`` allowing every device; never with
    ``disable_compile=True`` or a dynamic cache. Nothing is allocated and nothing runs."""
    config = copy.deepcopy(generate_kwargs.get("generation_config") or model.generation_config)
    for key in ("cache_implementation", "compile_config", "disable_compile"):
        if key in generate_kwargs:
            setattr(config, key, generate_kwargs[key])
    cache = generate_kwargs.get("cache", generate_kwargs.get("past_key_values"))
    if cache is None and config.cache_implementation in ("static", "offloaded_static"):
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=1,  # its tensors come on first use: none here
                            offloading=config.cache_implementation == "offloaded_static")
    if cache is None:
        return False
    # Transformers sets TOKENIZERS_PARALLELISM=0 when it will compile; only generate() itself should.
    with environment(TOKENIZERS_PARALLELISM=os.environ.get("TOKENIZERS_PARALLELISM")):
        return compat.valid_auto_compile_criteria(model, {"cache": cache}, config)


def static_cache_notice(model, **generate_kwargs) -> str | None:
    """One line when ``model.generate(**generate_kwargs)`` keeps a static cache uncompiled on this device, else ``None``.
    ``disable_compile=True`` says eager is meant, and silences it."""
    if will_auto_compile(model, **generate_kwargs):
        return None
    everywhere = generation_compile_config(model.device)
    if everywhere is None or not will_auto_compile(model, **{**generate_kwargs, "compile_config": everywhere}):
        return None  # no static cache, compiling switched off, or not the device's doing (offload, quantization)
    return (f"generate() with a static cache will not compile on {model.device.type}: Transformers auto-compiles "
            "only on cuda, xpu, neuron or tpu; pass compile_config=trnlab.generation_compile_config(model.device) "
            "to compile here (or disable_compile=True to run eagerly without this warning)")


def bucketed_generate(model, prompts: Prompts, *, buckets: ShapeBuckets, tokenizer=None,
                      pad_token_id: int | None = None, truncate: bool = False, compile: bool = True,
                      backend: str | None = None, compile_prefill: bool = False,
                      **generate_kwargs) -> torch.Tensor:
    """Greedy static-cache ``generate()`` with the prompts left-padded to their bucket; the same tokens as unpadded.
    A prompt longer than the longest bucket raises :class:`~trnlab.buckets.PromptTooLongError` (``truncate=True``
    keeps its last ``buckets.longest`` tokens, with a warning). ``max_new_tokens`` may be lowered, not raised."""
    buckets.check_model(model)
    max_new_tokens = generate_kwargs.pop("max_new_tokens", buckets.max_new_tokens)
    if max_new_tokens > buckets.max_new_tokens:
        raise ValueError(f"max_new_tokens={max_new_tokens} does not fit the cache sized for "
                         f"buckets.max_new_tokens={buckets.max_new_tokens}: build ShapeBuckets with more")
    for reserved in ("cache_implementation", "max_cache_len", "max_length", "input_ids", "attention_mask"):
        if reserved in generate_kwargs:
            raise ValueError(f"bucketed_generate sets {reserved} itself; leave it out")
    if pad_token_id is None:
        pad_token_id = tokenizer.pad_token_id if tokenizer is not None else model.generation_config.pad_token_id
    if pad_token_id is None:
        raise ValueError("this model has no pad token: pass pad_token_id= (often the eos token id)")
    ids = prompt_token_ids(prompts, tokenizer)
    length = max(len(row) for row in ids)
    if length > buckets.longest:
        if not truncate:
            bucket_for(length, buckets.lengths)  # raises PromptTooLongError with the fix
        warnings.warn(f"prompt of {length} tokens truncated to its last {buckets.longest} tokens "
                      "(the longest bucket)", UserWarning, stacklevel=2)
        ids = [row[-buckets.longest:] for row in ids]
        length = buckets.longest
    if compile_prefill and compat.attention_implementation(model) == "sdpa":
        warnings.warn("with SDPA attention an unpadded prompt passes no mask, a padded one does: two prefill "
                      "graphs per bucket. Load the model with attn_implementation='eager' for one.",
                      UserWarning, stacklevel=2)
    batch = pad_token_lists(ids, pad_token_id, "left", buckets.bucket_for(length))
    generate_kwargs.setdefault("do_sample", False)
    generate_kwargs |= generate_compile_kwargs(model, compile, backend, compile_prefill)
    output = model.generate(**batch, pad_token_id=pad_token_id, max_new_tokens=max_new_tokens,
                            cache_implementation="static", max_cache_len=buckets.cache_length, **generate_kwargs)
    return output[:, batch["input_ids"].shape[1] - length:]

