"""Generation on an explicit device, and through shape buckets: a few fixed prompt lengths, so a few graphs compile.
Prompts are a list of strings or a list of token-id lists; on Trainium each new shape compiles a graph."""

from __future__ import annotations

import copy
import numbers
import operator
import os
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import torch

from trnlab import _compat
from trnlab.settings import SettingError, _environment

__all__ = [
    "ShapeBuckets", "bucket_pad_tokens", "bucketed_generate", "choose_buckets",
    "compile_backend", "first_sentence", "format_forward_calls", "generate_batch", "generation_compile_config",
    "moved_to_model_device", "padding_by_bucket_count", "record_forward_inputs", "show_padding", "tokenize_batch",
]

_FORMS = "a list of strings or a list of token-id lists (e.g. [[9707, 11]])"


def _prompt_token_ids(prompts, tokenizer=None) -> list[list[int]]:
    """Each prompt's token ids; ``prompts`` is a list of strings or a list of token-id lists."""
    if isinstance(prompts, str):
        raise TypeError("prompts is one string, not a list: pass [prompt] for one prompt (prompts are a list of "
                        "strings or a list of token-id lists)")
    if not isinstance(prompts, (list, tuple)):
        got = "a tokenized batch (call model.generate(**batch) directly)" if isinstance(prompts, dict) else prompts
        raise TypeError(f"prompts must be {_FORMS}; got {got!s:.60}")
    if not prompts:
        raise SettingError(f"no prompts given (an empty list): pass {_FORMS}")
    if all(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise SettingError("text prompts need a tokenizer: pass tokenizer=trnlab.load_tokenizer(), or token ids")
        ids = [tokenizer(p)["input_ids"] for p in prompts]
    elif any(isinstance(p, str) for p in prompts):
        raise TypeError(f"prompts mix strings and token ids: pass {_FORMS}, one form at a time")
    else:
        bad = next((p for p in prompts if not isinstance(p, (list, tuple)) or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in p)), None)
        if bad is not None:
            raise TypeError(f"token ids must be non-negative ints, one list per prompt; got {bad!r:.60}: "
                            f"pass {_FORMS}")
        ids = [[int(i) for i in p] for p in prompts]
    empty = [i for i, row in enumerate(ids) if not row]
    if empty:
        raise SettingError(f"prompt {empty[0]} is empty (no tokens): every prompt needs at least one token")
    return ids


def _pad_token_lists(rows: Sequence[Sequence[int]], pad_token_id: int | None, side: str = "left",
                     length: int | None = None) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask``: ``rows`` padded on ``side`` to ``length`` (else the longest), mask 0."""
    if side not in ("left", "right"):
        raise SettingError(f"padding_side must be 'left' or 'right', not {side!r}")
    if pad_token_id is None:
        raise SettingError("no pad token id: set tokenizer.pad_token = tokenizer.eos_token (padding is masked "
                           "out by the attention mask), or pass pad_token_id=")
    length = length or max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(length - len(row), length) if side == "left" else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return {"input_ids": ids, "attention_mask": mask}


class _TensorInfo(NamedTuple):
    """Where one tensor lived and its shape, as the model's ``forward`` received it."""

    device: str
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"{self.device} {self.shape}"


def _describe_argument(value):
    if isinstance(value, dict):  # e.g. the attention masks of each layer type
        return {key: None if item is None else _describe_argument(item) for key, item in value.items()}
    if isinstance(value, torch.Tensor):
        return _TensorInfo(str(value.device), tuple(value.shape))
    layers = getattr(value, "layers", None)
    if layers is None:
        return repr(value)
    # a transformers Cache: say where its key tensors live (they are allocated on first use)
    devices = sorted({str(k.device) for k in (getattr(layer, "keys", None) for layer in layers)
                      if isinstance(k, torch.Tensor)})
    return f"{type(value).__name__} on {', '.join(devices) or 'nothing yet (allocated on first use)'}"


@contextmanager
def record_forward_inputs(model):
    """Record what each ``model.forward`` call in the block receives: a list of ``{argument: device and shape}``.
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
    lines = [f"forward {i} ({f'decode {i}' if i else 'prefill'}): {', '.join(f'{k}: {v}' for k, v in call.items())}"
             for i, call in enumerate(calls[:first])]
    if len(calls) > first:
        lines.append(f"... {len(calls) - first} more forward call(s) like 'decode 1'")
    return "\n".join(lines)


def moved_to_model_device(calls: Sequence[dict], inputs_device: str | torch.device) -> list[str]:
    """Names of the tensor arguments that reached ``forward`` on another device than the inputs'."""
    device = str(torch.device(inputs_device))
    return sorted({f"{name}[{key!r}]" if key else name for call in calls for name, info in call.items()
                   for key, item in (info.items() if isinstance(info, dict) else [(None, info)])
                   if isinstance(item, _TensorInfo) and item.device != device})


def tokenize_batch(tokenizer, prompts, padding_side: str = "left") -> dict:
    """``prompts`` (a list of texts or of token-id lists) as one batch on CPU, padded on ``padding_side`` with the pad token."""
    return _pad_token_lists(_prompt_token_ids(prompts, tokenizer), tokenizer.pad_token_id, padding_side)


def show_padding(tokenizer, batch: dict, pad_symbol: str = "_") -> str:
    """One line per row of a tokenized batch: its attention mask, then its tokens (pads drawn as ``pad_symbol``)."""
    lines = []
    for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
        text = "".join(pad_symbol if m == 0 else tokenizer.decode([i]) for i, m in zip(ids, mask))
        lines.append(f"mask {''.join(map(str, mask))} | {text}")
    return "\n".join(lines)


def generate_batch(model, tokenizer, prompts, padding_side: str = "left", use_attention_mask: bool = True,
                   **generate_kwargs) -> list[str]:
    """Each prompt's decoded continuation, generated as one padded batch; inputs stay on CPU (claim 4).
    ``padding_side`` and ``use_attention_mask`` exist to show what goes wrong without them: keep the defaults."""
    batch = tokenize_batch(tokenizer, prompts, padding_side)
    inputs = batch if use_attention_mask else {"input_ids": batch["input_ids"]}
    generate_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    notice = _static_cache_notice(model, **generate_kwargs)
    if notice:
        warnings.warn(notice, UserWarning, stacklevel=2)
    output = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def first_sentence(text: str) -> str:
    """``text`` up to its first ``.``, ``!`` or ``?``, stripped: where float32 and bfloat16 continuations must agree."""
    text = text.strip()
    ends = [i for i in (text.find(mark) for mark in ".!?") if i >= 0]
    return text[: min(ends) + 1] if ends else text


def compile_backend(device: torch.device | str, requested: str | None = None) -> str:
    """The ``torch.compile`` backend on ``device``: ``"neuron"`` on Neuron, else ``requested`` or ``"eager"``.
    On Neuron another ``requested`` raises; ``"eager"`` counts each graph (one per shape, as on Neuron) cheaply."""
    if torch.device(device).type == "neuron":
        if requested not in (None, "neuron"):
            raise SettingError(f"backend {requested!r} cannot compile for a NeuronCore: on Neuron use "
                               "backend='neuron' (or leave it unset)")
        return "neuron"
    return requested or "eager"


def generation_compile_config(device: torch.device | str, backend: str | None = None):
    """The ``compile_config`` that makes ``generate()`` compile here as it does on Neuron (``None`` on Neuron itself).
    :func:`compile_backend`'s choice, ``dynamic=False``, on every device: ``generate(..., compile_config=...)``."""
    from transformers import CompileConfig

    chosen = compile_backend(device, backend)
    if chosen == "neuron":
        return None
    config = CompileConfig(backend=chosen, dynamic=False, mode="default")
    _compat.compile_on_every_device(config)
    return config


def _generate_compile_kwargs(model, compile: bool = True, backend: str | None = None,
                             compile_prefill: bool = False) -> dict:
    """``generate()`` keyword arguments that turn compiling off (claim 6), or on the Neuron way (with the prefill)."""
    if not compile:
        return {"disable_compile": True}
    config = generation_compile_config(model.device, backend)
    kwargs = {} if config is None else {"compile_config": config}
    if compile_prefill:
        kwargs["prefill_chunk_size"] = model.config.max_position_embeddings  # one chunk as long as any prompt
    return kwargs


def _will_auto_compile(model, **generate_kwargs) -> bool:
    """Whether ``model.generate(**generate_kwargs)`` compiles its forward by itself: Transformers' own rule, asked."""
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
    with _environment(TOKENIZERS_PARALLELISM=os.environ.get("TOKENIZERS_PARALLELISM")):
        return _compat.valid_auto_compile_criteria(model, {"cache": cache}, config)


def _static_cache_notice(model, **generate_kwargs) -> str | None:
    """One line when ``generate(**generate_kwargs)`` leaves a static cache uncompiled here (not when told to)."""
    if _will_auto_compile(model, **generate_kwargs):
        return None
    everywhere = generation_compile_config(model.device)
    if everywhere is None or not _will_auto_compile(model, **{**generate_kwargs, "compile_config": everywhere}):
        return None  # no static cache, compiling switched off, or not the device's doing (offload, quantization)
    return (f"generate() with a static cache will not compile on {model.device.type}: Transformers auto-compiles "
            "only on cuda, xpu, neuron or tpu; pass compile_config=trnlab.generation_compile_config(model.device) "
            "to compile here (or disable_compile=True to run eagerly without this warning)")


def _count(value) -> int:
    """``value`` as an int if it is a whole number >= 1 (numpy integers too, bools not), else 0."""
    try:
        return 0 if isinstance(value, bool) else max(operator.index(value), 0)
    except TypeError:
        return 0


def _lengths(lengths: Iterable[int], what: str = "prompt lengths") -> list[int]:
    """``lengths`` as a list of positive token counts, else an error saying what to pass."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        kind = "a string" if isinstance(lengths, (str, bytes)) else type(lengths).__name__
        raise TypeError(f"{what} must be a sequence of {'bucket lengths' if what == 'buckets' else 'token counts'}, "
                        f"not {kind} (e.g. [12, 40, 7])")
    lengths = list(lengths)
    if not lengths and what == "buckets":
        raise SettingError("buckets is empty: pass at least one bucket length (padded prompt lengths in tokens), e.g. "
                           "(32, 64, 128), or let trnlab.choose_buckets(prompt_lengths, k) pick them from your prompts")
    if not lengths:
        raise SettingError(f"{what} is empty: pass the token counts of your prompts (a sample of them will do)")
    bad = [n for n in lengths if not _count(n)]
    if bad:
        raise SettingError(f"{what} must be positive integers (token counts), got {bad[:5]}")
    return [_count(n) for n in lengths]


def _bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds a prompt of ``length`` tokens, else :class:`~trnlab.settings.SettingError`."""
    buckets = _lengths(buckets, "buckets")
    if length > max(buckets):
        raise SettingError(
            f"a prompt of {length} tokens is longer than the longest bucket ({max(buckets)}): add a bucket of at "
            f"least {length} tokens, or pass truncate=True to keep its last {max(buckets)} tokens")
    return min(b for b in buckets if b >= length)


def bucket_pad_tokens(lengths: Iterable[int], buckets: Sequence[int]) -> int:
    """Pad tokens added when each prompt length is padded up to the smallest bucket that holds it."""
    buckets = _lengths(buckets, "buckets")
    return sum(_bucket_for(n, buckets) - n for n in _lengths(lengths))


def choose_buckets(lengths: Iterable[int], k: int) -> tuple[int, ...]:
    """The at most ``k`` bucket lengths (the graph budget) that minimise :func:`bucket_pad_tokens` for ``lengths``."""
    given, k = k, _count(k)
    if k < 1:
        raise SettingError(f"k is the number of buckets (graphs you accept to compile): a positive integer, "
                           f"got {given!r}")
    counts = sorted(Counter(_lengths(lengths)).items())
    values = [v for v, _ in counts]
    if k >= len(values):
        return tuple(values)
    prompts, tokens = [0], [0]  # prefix sums: prompts and tokens among the first i distinct lengths
    for value, count in counts:
        prompts.append(prompts[-1] + count)
        tokens.append(tokens[-1] + count * value)

    def waste(i: int, j: int) -> int:  # lengths i..j padded up to values[j]
        return (prompts[j + 1] - prompts[i]) * values[j] - (tokens[j + 1] - tokens[i])

    # A dynamic programme, exact: per j the least waste of lengths 0..j and its buckets, one bucket more per round
    best = [(waste(0, j), (values[j],)) for j in range(len(values))]
    for _ in range(k - 1):  # on a tie, the earliest previous bucket
        best = [min(((best[i][0] + waste(i + 1, j), i, best[i][1] + (values[j],)) for i in range(j)),
                    default=(0, 0, best[0][1]))[::2] for j in range(len(values))]
    return best[-1][1]


def padding_by_bucket_count(lengths: Iterable[int], max_k: int) -> list[dict]:
    """For k = 1 .. ``max_k``: the chosen ``buckets``, their ``pad_tokens`` and ``padding_waste`` (of all tokens)."""
    lengths = _lengths(lengths)
    rows = []
    for k in range(1, max_k + 1):
        buckets = choose_buckets(lengths, k)
        pads = bucket_pad_tokens(lengths, buckets)
        rows.append({"k": k, "buckets": buckets, "pad_tokens": pads, "padding_waste": pads / (pads + sum(lengths))})
    return rows


@dataclass(frozen=True)
class ShapeBuckets:
    """The static shapes a bucketed workload compiles: prompt ``lengths`` and one cache length.
    Prompts are left-padded to the smallest bucket that holds them, with a static cache of :attr:`cache_length` =
    longest bucket + ``max_new_tokens``: at most one graph per bucket plus the decode graph."""

    lengths: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self):
        object.__setattr__(self, "lengths", tuple(sorted(set(_lengths(self.lengths, "buckets")))))
        if not _count(self.max_new_tokens):
            raise SettingError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    @property
    def cache_length(self) -> int:
        """Static cache length of every request: room for the longest bucket and the new tokens."""
        return self.longest + self.max_new_tokens

    def bucket_for(self, length: int) -> int:
        """The padded length of a prompt of ``length`` tokens (:class:`~trnlab.settings.SettingError` past the longest)."""
        return _bucket_for(length, self.lengths)

    def check_model(self, model) -> None:
        """Raise if the cache would hold more positions than ``model`` was trained for."""
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and self.cache_length > limit:
            raise SettingError(
                f"buckets up to {self.longest} tokens + max_new_tokens={self.max_new_tokens} need a cache of "
                f"{self.cache_length} positions, but the model has max_position_embeddings={limit}: "
                "lower the longest bucket or max_new_tokens")


def bucketed_generate(model, prompts, *, buckets: ShapeBuckets, tokenizer=None, pad_token_id: int | None = None,
                      truncate: bool = False, compile: bool = True, backend: str | None = None,
                      compile_prefill: bool = False, **generate_kwargs) -> torch.Tensor:
    """Greedy static-cache ``generate()`` with the prompts left-padded to their bucket; the same tokens as unpadded.
    A prompt longer than the longest bucket raises :class:`~trnlab.settings.SettingError` (``truncate=True`` keeps its last
    ``buckets.longest`` tokens, with a warning). ``max_new_tokens`` may be lowered, not raised."""
    buckets.check_model(model)
    max_new_tokens = generate_kwargs.pop("max_new_tokens", buckets.max_new_tokens)
    if max_new_tokens > buckets.max_new_tokens:
        raise SettingError(f"max_new_tokens={max_new_tokens} does not fit the cache sized for "
                           f"buckets.max_new_tokens={buckets.max_new_tokens}: build ShapeBuckets with more")
    for reserved in ("cache_implementation", "max_cache_len", "max_length", "input_ids", "attention_mask"):
        if reserved in generate_kwargs:
            raise SettingError(f"bucketed_generate sets {reserved} itself; leave it out")
    if pad_token_id is None:
        pad_token_id = (model.generation_config if tokenizer is None else tokenizer).pad_token_id
    ids = _prompt_token_ids(prompts, tokenizer)
    length = max(len(row) for row in ids)
    if length > buckets.longest:
        if not truncate:
            buckets.bucket_for(length)  # raises SettingError with the fix
        warnings.warn(f"prompt of {length} tokens truncated to its last {buckets.longest} tokens "
                      "(the longest bucket)", UserWarning, stacklevel=2)
        ids, length = [row[-buckets.longest:] for row in ids], buckets.longest
    if compile_prefill and _compat.attention_implementation(model) == "sdpa":
        warnings.warn("with SDPA attention an unpadded prompt passes no mask, a padded one does: two prefill graphs "
                      "per bucket. Load the model with attn_implementation='eager' for one.", UserWarning, stacklevel=2)
    batch = _pad_token_lists(ids, pad_token_id, "left", buckets.bucket_for(length))
    generate_kwargs.setdefault("do_sample", False)
    generate_kwargs |= _generate_compile_kwargs(model, compile, backend, compile_prefill)
    output = model.generate(**batch, pad_token_id=pad_token_id, max_new_tokens=max_new_tokens,
                            cache_implementation="static", max_cache_len=buckets.cache_length, **generate_kwargs)
    return output[:, batch["input_ids"].shape[1] - length:]
