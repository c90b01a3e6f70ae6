"""Generation on an explicit device, compiled generation, and shape bucketing.

Notebook 02 uses :func:`record_forward_inputs`, :func:`generate_batch` and
:func:`show_padding` to show what ``generate()`` hands the model and why decoder-only models
pad on the left. Notebook 03 and ``python -m trnlab bench generate`` use the rest:

- :func:`generation_compile_config` turns on ``generate()``'s static-cache compile the way
  Neuron does it (``dynamic=False``), on any device;
- :class:`ShapeBuckets` and :func:`bucketed_generate` pad prompts to a few fixed lengths and
  a fixed cache length, so any workload compiles at most one graph per bucket;
- :func:`choose_buckets` picks the bucket lengths that waste the fewest padded tokens;
- :func:`run_generation_workload` runs a stream of prompts and counts graphs per request.

What ``generate()`` compiles (transformers 5.24): with a static cache it compiles the forward
of the *decode* step, whose shapes are the batch size and the cache length (prompt length +
``max_new_tokens``, grown to the largest seen so far on this model). The *prefill* (the
whole prompt) runs eagerly unless ``prefill_chunk_size`` is set; then it goes through the
compiled forward too, one graph per prompt length. On Neuron even eager ops are compiled, op
by op, for every new shape, so a prompt length the device has not seen costs compile time
either way; ``compile_prefill=True`` below makes that cost visible as graphs on any machine.
"""

from __future__ import annotations

import math
import random
import statistics
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from trnlab.compile_tracking import CompileTracker

# --------------------------------------------------------------------------------------------
# Notebook 02: what generate() hands the model
# --------------------------------------------------------------------------------------------


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

    Yields a list that fills with one dict per forward call: argument name to
    :class:`TensorInfo` (device and shape) for tensors, ``"StaticCache on cpu"`` for a cache,
    ``repr`` for anything else (a forward pre-hook, removed at the end). Notebook 02 uses it to
    show that ``generate()`` hands the model fixed-size slices on the model's device. Use it on
    eager generation: a compiled forward would trace the hook into its graph.
    """
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


def tokenize_batch(tokenizer, prompts: Sequence[str], padding_side: str = "left") -> dict:
    """Tokenize ``prompts`` as one padded batch on CPU, padded on ``padding_side``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    saved, tokenizer.padding_side = tokenizer.padding_side, padding_side
    try:
        return dict(tokenizer(list(prompts), return_tensors="pt", padding=True))
    finally:
        tokenizer.padding_side = saved


def show_padding(tokenizer, batch: dict, pad_symbol: str = "_") -> str:
    """One line per row of a tokenized batch: its attention mask, then its tokens.

    Pad tokens are drawn as ``pad_symbol`` so the side they sit on shows; notebook 02 prints
    left- and right-padded batches with it.
    """
    lines = []
    for ids, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist()):
        text = "".join(pad_symbol if m == 0 else tokenizer.decode([i]) for i, m in zip(ids, mask))
        lines.append(f"mask {''.join(map(str, mask))} | {text}")
    return "\n".join(lines)


def generate_batch(model, tokenizer, prompts: Sequence[str], padding_side: str = "left",
                   use_attention_mask: bool = True, **generate_kwargs) -> list[str]:
    """Generate for ``prompts`` as one padded batch and return each decoded continuation.

    Inputs stay on CPU (``generate()`` moves what the forward needs). ``padding_side`` and
    ``use_attention_mask`` exist to show, in notebook 02, what goes wrong without left
    padding and without the mask; keep the defaults in real code.
    """
    batch = tokenize_batch(tokenizer, prompts, padding_side)
    inputs = {"input_ids": batch["input_ids"]}
    if use_attention_mask:
        inputs["attention_mask"] = batch["attention_mask"]
    generate_kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    output = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


# --------------------------------------------------------------------------------------------
# Notebook 03: compiled generation
# --------------------------------------------------------------------------------------------


def generation_compile_config(device: str | torch.device, backend: str | None = None):
    """The ``compile_config`` that makes ``generate()`` compile like it does on Neuron.

    On Neuron with ``backend`` None or ``"neuron"`` it returns ``None``: transformers already
    compiles the static-cache forward there with ``CompileConfig(backend="neuron",
    dynamic=False, mode="default")``, so leave it alone. Anywhere else it returns that same
    config with ``backend`` (default ``"inductor"``) and ``_compile_all_devices=True``: without
    it ``generate()`` compiles only on cuda/xpu/neuron/tpu, never on CPU. ``dynamic=False``
    makes every new shape a new graph, as on Neuron. Pass it as ``compile_config=``.
    """
    from transformers import CompileConfig

    device = torch.device(device)
    if device.type == "neuron" and backend in (None, "neuron"):
        return None
    config = CompileConfig(backend=backend or "inductor", dynamic=False, mode="default")
    # Read by generate's `_valid_auto_compile_criteria`; not a dataclass field, so set it here.
    config._compile_all_devices = True
    return config


def reset_compile_state(model=None) -> None:
    """Forget every compiled graph, and the static-cache length ``model`` remembers.

    ``torch._dynamo.reset()`` drops compiled graphs; ``generate()`` also keeps, on the model,
    the largest static cache length used so far and reuses it (so shorter prompts reuse a
    graph). Notebook 03 calls this between experiments so each starts cold and its graph
    count does not depend on what ran before.
    """
    torch._dynamo.reset()
    if model is not None:
        for name in ("_compiled_call", "_last_compile_config", "_previous_max_cache_length"):
            model.__dict__.pop(name, None)


def _generate_compile_kwargs(model, compile: bool, backend: str | None, compile_prefill: bool) -> dict:
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


# --------------------------------------------------------------------------------------------
# Shape bucketing
# --------------------------------------------------------------------------------------------


class PromptTooLongError(ValueError):
    """A prompt is longer than the longest bucket."""


def _check_lengths(lengths: Iterable[int], max_length: int | None = None) -> list[int]:
    lengths = list(lengths)
    if not lengths:
        raise ValueError("need at least one prompt length: pass the token counts of a sample of your prompts")
    bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad:
        raise ValueError(f"prompt lengths must be positive integers (token counts), got {bad[:5]}")
    if max_length is not None and max(lengths) > max_length:
        raise ValueError(
            f"a prompt length of {max(lengths)} exceeds max_length={max_length} (the model's "
            "max_position_embeddings): truncate those prompts or use a model with a longer context")
    return lengths


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds a prompt of ``length`` tokens.

    Raises :class:`PromptTooLongError` when ``length`` exceeds every bucket: padding cannot
    shorten a prompt, and silently cutting it would change the answer.
    """
    fitting = [b for b in buckets if b >= length]
    if not fitting:
        raise PromptTooLongError(
            f"a prompt of {length} tokens is longer than the longest bucket ({max(buckets)}): add a "
            f"bucket of at least {length} tokens, or pass truncate=True to keep its last "
            f"{max(buckets)} tokens")
    return min(fitting)


def bucket_padding_tokens(lengths: Iterable[int], buckets: Sequence[int]) -> int:
    """Pad tokens added when each prompt length is padded up to its bucket (see :func:`bucket_for`)."""
    lengths = _check_lengths(lengths)
    buckets = sorted(_check_lengths(buckets))
    return sum(bucket_for(n, buckets) - n for n in lengths)


def choose_buckets(lengths: Iterable[int], k: int, max_length: int | None = None) -> tuple[int, ...]:
    """The at most ``k`` bucket lengths that minimise :func:`bucket_padding_tokens` for ``lengths``.

    ``lengths`` are the token counts of a sample of prompts, ``k`` the graph budget. An
    optimal bucket set uses only sample lengths (lowering a bucket to the longest prompt it
    holds only saves padding) and must contain the longest, so a dynamic programme over the
    sorted distinct lengths finds it exactly: ``best[m][j]`` is the least waste covering the
    first ``j + 1`` distinct lengths with ``m`` buckets, the last one at length ``j``. With
    ``k`` at least the number of distinct lengths every length is its own bucket (no waste).
    ``max_length`` (e.g. ``max_position_embeddings``) rejects lengths the model cannot take.
    Notebook 03 plots the waste against ``k``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k is the number of buckets (graphs you accept to compile): a positive integer, got {k!r}")
    counts = sorted(Counter(_check_lengths(lengths, max_length)).items())
    values = [v for v, _ in counts]
    if k >= len(values):
        return tuple(values)
    # prefix sums: number of prompts and of tokens among the first i distinct lengths
    n_prompts, n_tokens = [0], [0]
    for value, count in counts:
        n_prompts.append(n_prompts[-1] + count)
        n_tokens.append(n_tokens[-1] + count * value)

    def waste(i: int, j: int) -> int:  # lengths i..j padded up to values[j]
        return (n_prompts[j + 1] - n_prompts[i]) * values[j] - (n_tokens[j + 1] - n_tokens[i])

    n = len(values)
    best = [[waste(0, j) for j in range(n)]]
    previous: list[list[int | None]] = [[None] * n]
    for m in range(1, k):
        row, back = [math.inf] * n, [None] * n
        for j in range(m, n):
            for i in range(m - 1, j):
                cost = best[m - 1][i] + waste(i + 1, j)
                if cost < row[j]:
                    row[j], back[j] = cost, i
        best.append(row)
        previous.append(back)
    chosen, j = [], n - 1
    for m in range(k - 1, -1, -1):
        chosen.append(values[j])
        j = previous[m][j]
    return tuple(sorted(chosen))


def waste_by_bucket_count(lengths: Iterable[int], max_k: int) -> list[dict]:
    """For k = 1 .. ``max_k``: the chosen buckets, padded tokens and waste fraction (for a plot).

    The waste fraction is pad tokens over all tokens the model processes (prompts + pads).
    """
    lengths = _check_lengths(lengths)
    rows = []
    for k in range(1, max_k + 1):
        buckets = choose_buckets(lengths, k)
        wasted = bucket_padding_tokens(lengths, buckets)
        rows.append({"k": k, "buckets": buckets, "padded_tokens": wasted,
                     "waste_fraction": wasted / (wasted + sum(lengths))})
    return rows


@dataclass(frozen=True)
class ShapeBuckets:
    """The static shapes a bucketed workload compiles: prompt lengths and one cache length.

    Prompts are left-padded up to the smallest bucket that holds them, and every request
    gets a static cache of :attr:`cache_length` = longest bucket + ``max_new_tokens``. Then
    the decode step always has the same shapes (one graph), and the prefill one shape per
    bucket: at most one graph per bucket plus the decode graph, for any workload.
    """

    lengths: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self):
        if isinstance(self.lengths, int):
            raise ValueError("lengths is a sequence of bucket lengths, e.g. (32, 64, 128)")
        object.__setattr__(self, "lengths", tuple(sorted(set(_check_lengths(self.lengths)))))
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    @property
    def cache_length(self) -> int:
        """Static cache length of every request: room for the longest bucket and the new tokens."""
        return self.longest + self.max_new_tokens

    def bucket_for(self, length: int) -> int:
        """The padded length of a prompt of ``length`` tokens (see :func:`bucket_for`)."""
        return bucket_for(length, self.lengths)

    def check_model(self, model) -> None:
        """Raise if the cache would hold more positions than ``model`` was trained for."""
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and self.cache_length > limit:
            raise ValueError(
                f"buckets up to {self.longest} tokens + max_new_tokens={self.max_new_tokens} need a cache of "
                f"{self.cache_length} positions, but the model has max_position_embeddings={limit}: "
                "lower the longest bucket or max_new_tokens")


def left_pad(input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int,
             pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad a batch to ``length`` columns: pad tokens whose attention mask is 0."""
    extra = length - input_ids.shape[1]
    if extra < 0:
        raise ValueError(f"cannot left-pad {input_ids.shape[1]} tokens down to {length}")
    pads = input_ids.new_full((input_ids.shape[0], extra), pad_token_id)
    zeros = attention_mask.new_zeros((attention_mask.shape[0], extra))
    return torch.cat([pads, input_ids], dim=1), torch.cat([zeros, attention_mask], dim=1)


def bucketed_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      buckets: ShapeBuckets, pad_token_id: int | None = None, truncate: bool = False,
                      compile: bool = True, backend: str | None = None, compile_prefill: bool = False,
                      **generate_kwargs) -> torch.Tensor:
    """Greedy static-cache ``generate()`` with the prompt padded to its bucket.

    Returns what ``model.generate(input_ids, attention_mask, max_new_tokens=...,
    cache_implementation="static")`` returns, token for token: the pad columns added here
    are removed again. Left padding with the attention mask leaves the answer unchanged
    (position ids come from the mask, pads are never attended to).

    A prompt longer than the longest bucket raises :class:`PromptTooLongError`; with
    ``truncate=True`` it keeps its last ``buckets.longest`` tokens instead (with a warning),
    and the output starts with that shortened prompt. ``compile``, ``backend`` and
    ``compile_prefill`` are those of :func:`run_generation_workload`; ``max_new_tokens`` may
    be lowered below ``buckets.max_new_tokens`` but not raised.
    """
    buckets.check_model(model)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    max_new_tokens = generate_kwargs.pop("max_new_tokens", buckets.max_new_tokens)
    if max_new_tokens > buckets.max_new_tokens:
        raise ValueError(f"max_new_tokens={max_new_tokens} does not fit the cache sized for "
                         f"buckets.max_new_tokens={buckets.max_new_tokens}: build ShapeBuckets with more")
    for reserved in ("cache_implementation", "max_cache_len", "max_length"):
        if reserved in generate_kwargs:
            raise ValueError(f"bucketed_generate sets {reserved} itself; leave it out")
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
    if pad_token_id is None:
        raise ValueError("this model has no pad token: pass pad_token_id= (often the eos token id)")
    length = input_ids.shape[1]
    if length > buckets.longest:
        if not truncate:
            bucket_for(length, buckets.lengths)  # raises PromptTooLongError with the fix
        warnings.warn(f"prompt of {length} tokens truncated to its last {buckets.longest} tokens "
                      "(the longest bucket)", UserWarning, stacklevel=2)
        input_ids, attention_mask = input_ids[:, -buckets.longest:], attention_mask[:, -buckets.longest:]
        length = buckets.longest
    if compile_prefill and getattr(model.config, "_attn_implementation", None) == "sdpa":
        warnings.warn("with SDPA attention an unpadded prompt passes no mask, a padded one does: two prefill "
                      "graphs per bucket. Load the model with attn_implementation='eager' for one.",
                      UserWarning, stacklevel=2)
    padded_ids, padded_mask = left_pad(input_ids, attention_mask, buckets.bucket_for(length), pad_token_id)
    generate_kwargs.setdefault("do_sample", False)
    generate_kwargs |= _generate_compile_kwargs(model, compile, backend, compile_prefill)
    output = model.generate(input_ids=padded_ids, attention_mask=padded_mask, pad_token_id=pad_token_id,
                            max_new_tokens=max_new_tokens, cache_implementation="static",
                            max_cache_len=buckets.cache_length, **generate_kwargs)
    return output[:, padded_ids.shape[1] - length:]


# --------------------------------------------------------------------------------------------
# Workloads: a stream of prompts, one request at a time
# --------------------------------------------------------------------------------------------


def sample_prompt_lengths(n: int, shortest: int, longest: int, seed: int = 0) -> list[int]:
    """``n`` prompt lengths drawn uniformly from ``shortest`` .. ``longest`` tokens (seeded)."""
    if n < 1 or shortest < 1 or longest < shortest:
        raise ValueError(f"need n >= 1 and 1 <= shortest <= longest, got n={n}, {shortest}..{longest}")
    rng = random.Random(seed)
    return [rng.randint(shortest, longest) for _ in range(n)]


def corpus_prompts(tokenizer, lengths: Sequence[int], seed: int = 0) -> list[torch.Tensor]:
    """One prompt of exactly each length, cut from the course corpus: ``(1, length)`` CPU tensors.

    The text comes from :func:`trnlab.assets.generate_documents`, so the course model has
    seen text like it; each prompt is a window starting at a seeded random token.
    """
    from trnlab.assets import generate_documents

    lengths = _check_lengths(lengths)
    rng = random.Random(seed)
    ids: list[int] = []
    documents = 0
    while len(ids) < 4 * max(lengths):
        documents += 50
        # document by document: one long string would trip the tokenizer's max-length warning
        texts = generate_documents(documents, seed)
        ids = [i for n, text in enumerate(texts) for i in tokenizer((" " if n else "") + text)["input_ids"]]
    prompts = []
    for length in lengths:
        start = rng.randrange(0, len(ids) - length)
        prompts.append(torch.tensor([ids[start:start + length]]))
    return prompts


@dataclass
class RequestRecord:
    """One request of a workload: its shapes, its answer and what it cost."""

    prompt_length: int
    padded_length: int
    cache_length: int | None
    new_tokens: list[int]
    seconds: float
    new_graphs: int
    compile_seconds: float


@dataclass
class WorkloadResult:
    """The requests of one :func:`run_generation_workload` run and their compile tracker."""

    label: str
    requests: list[RequestRecord] = field(default_factory=list)
    tracker: CompileTracker = field(default_factory=CompileTracker)
    compile_prefill: bool = False

    @property
    def graphs(self) -> int:
        return self.tracker.graphs

    @property
    def compile_seconds(self) -> float:
        return self.tracker.compile_seconds

    @property
    def outputs(self) -> list[list[int]]:
        """The new tokens of each request."""
        return [r.new_tokens for r in self.requests]

    def _shapes(self, record: RequestRecord) -> set:
        shapes = {("decode", record.cache_length)}
        if self.compile_prefill:
            shapes.add(("prefill", record.padded_length, record.cache_length))
        return shapes

    @property
    def distinct_shapes(self) -> int:
        """Distinct static shapes the compiled forward saw: what ``graphs`` should equal.

        The decode step's shape is the cache length; with ``compile_prefill`` each
        (padded prompt length, cache length) pair of the prefill is a shape too.
        """
        return len(set().union(*(self._shapes(r) for r in self.requests)))

    def table(self) -> list[dict]:
        """One row per request: lengths, new graphs, seconds, and running totals (for plots)."""
        rows, seen, graphs, seconds = [], set(), 0, 0.0
        for i, r in enumerate(self.requests):
            seen |= self._shapes(r)
            graphs += r.new_graphs
            seconds += r.compile_seconds
            rows.append({"request": i, "prompt_length": r.prompt_length, "padded_length": r.padded_length,
                         "cache_length": r.cache_length, "new_tokens": len(r.new_tokens),
                         "new_graphs": r.new_graphs, "seconds": r.seconds, "compile_seconds": r.compile_seconds,
                         "graphs_so_far": graphs, "shapes_so_far": len(seen), "compile_seconds_so_far": seconds})
        return rows

    def tokens_per_second(self, steady_only: bool = True) -> float | None:
        """New tokens per second over the requests that compiled nothing (or over all)."""
        chosen = [r for r in self.requests if r.new_graphs == 0 or not steady_only]
        seconds = sum(r.seconds for r in chosen)
        return sum(len(r.new_tokens) for r in chosen) / seconds if chosen and seconds > 0 else None

    def steady_seconds(self) -> float | None:
        """Median seconds of the requests that compiled nothing."""
        steady = [r.seconds for r in self.requests if r.new_graphs == 0]
        return statistics.median(steady) if steady else None

    def summary(self) -> dict:
        """The run's figures as a dict (the benchmark's JSON and notebook 03's table)."""
        return {"label": self.label, "requests": len(self.requests), "graphs": self.graphs,
                "distinct_shapes": self.distinct_shapes, "compile_seconds": self.compile_seconds,
                "recompile_limit_hits": self.tracker.recompile_limit_hits,
                "first_request_seconds": self.requests[0].seconds if self.requests else None,
                "steady_request_seconds": self.steady_seconds(),
                "steady_tokens_per_second": self.tokens_per_second(),
                "padded_tokens": sum(r.padded_length - r.prompt_length for r in self.requests)}


def run_generation_workload(model, prompts: Sequence[torch.Tensor], max_new_tokens: int, *,
                            buckets: ShapeBuckets | None = None, compile: bool = True,
                            backend: str | None = None, compile_prefill: bool = False,
                            pad_token_id: int | None = None, recompile_limit: int | None = None,
                            label: str | None = None) -> WorkloadResult:
    """Greedy static-cache generation for each prompt in turn, tracking graphs per request.

    ``prompts`` are ``(1, length)`` CPU tensors (e.g. from :func:`corpus_prompts`). With
    ``buckets`` each goes through :func:`bucketed_generate`, else straight to ``generate()``.
    ``compile=False`` passes ``disable_compile=True``; otherwise
    :func:`generation_compile_config` with ``backend`` applies (Neuron's own default there).
    ``compile_prefill`` compiles the prefill too (see the module docstring).
    ``recompile_limit`` temporarily raises dynamo's limit of graphs per function (8 by
    default; past it dynamo stops compiling and runs new shapes eagerly), so the count shows
    every shape.
    """
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
    result = WorkloadResult(label or ("bucketed" if buckets else "unbucketed"), compile_prefill=compile_prefill)
    limit = torch._dynamo.config.patch(recompile_limit=recompile_limit) if recompile_limit else nullcontext()
    with limit, result.tracker as tracker:
        for i, input_ids in enumerate(prompts):
            length = input_ids.shape[1]
            mask = torch.ones_like(input_ids)
            with tracker.call(f"request {i}"):
                if buckets is not None:
                    output = bucketed_generate(model, input_ids, mask, buckets=buckets, pad_token_id=pad_token_id,
                                               compile=compile, backend=backend, compile_prefill=compile_prefill,
                                               max_new_tokens=max_new_tokens)
                else:
                    output = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                                            max_new_tokens=max_new_tokens, cache_implementation="static",
                                            pad_token_id=pad_token_id,
                                            **_generate_compile_kwargs(model, compile, backend, compile_prefill))
            call = tracker.calls[-1]
            result.requests.append(RequestRecord(
                prompt_length=length,
                padded_length=buckets.bucket_for(length) if buckets is not None else length,
                # the static cache length generate() used (it keeps the largest so far on the model)
                cache_length=getattr(model, "_previous_max_cache_length", None),
                new_tokens=output[0, length:].tolist(), seconds=call.seconds,
                new_graphs=call.new_graphs, compile_seconds=call.compile_seconds))
    return result


def identical_outputs(a: WorkloadResult, b: WorkloadResult) -> bool:
    """Whether two runs over the same prompts generated exactly the same tokens."""
    return a.outputs == b.outputs


def time_generation(model, inputs: dict, repeats: int = 3, label: str = "generate",
                    **generate_kwargs) -> dict:
    """Call ``model.generate(**inputs, **generate_kwargs)`` ``repeats`` times and time it.

    Returns the first call's seconds (it includes any compilation), the median of the
    later calls, new tokens per second at that steady state, and the graphs compiled.
    Notebook 03's eager-vs-compiled table is made of these rows.
    """
    new_tokens = 0
    with CompileTracker() as tracker:
        for _ in range(repeats):
            with tracker.call(label):
                output = model.generate(**inputs, **generate_kwargs)
            new_tokens = output.shape[0] * (output.shape[1] - inputs["input_ids"].shape[1])
    later = [c.seconds for c in tracker.calls[1:]]
    steady = statistics.median(later) if later else None
    return {"label": label, "graphs": tracker.graphs, "compile_seconds": tracker.compile_seconds,
            "first_call_seconds": tracker.calls[0].seconds, "steady_seconds": steady,
            "steady_tokens_per_second": new_tokens / steady if steady else None,
            "new_tokens": new_tokens}
