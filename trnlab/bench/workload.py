"""The workload harness: a stream of prompts, one request at a time, with graphs counted per request.
Notebook 03 and ``python -m trnlab bench generate`` run it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import torch

from trnlab import compat
from trnlab.assets import generate_documents
from trnlab.buckets import ShapeBuckets, check_lengths
from trnlab.compile_tracking import CompileTracker, recompile_limit as raised_recompile_limit, steady_median
from trnlab.generation import Prompts, bucketed_generate, generate_compile_kwargs, prompt_token_ids

__all__ = ["RequestRecord", "WorkloadResult", "corpus_prompts", "identical_outputs", "run_generation_workload",
           "sample_prompt_lengths"]


def sample_prompt_lengths(n: int, shortest: int, longest: int, seed: int = 0) -> list[int]:
    """``n`` prompt lengths drawn uniformly from ``shortest`` .. ``longest`` tokens (seeded)."""
    if n < 1 or shortest < 1 or longest < shortest:
        raise ValueError(f"need n >= 1 and 1 <= shortest <= longest, got n={n}, {shortest}..{longest}")
    rng = random.Random(seed)
    return [rng.randint(shortest, longest) for _ in range(n)]


def corpus_prompts(tokenizer, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    """One prompt of exactly each length, cut from the course corpus at a seeded offset, as token-id lists."""
    lengths = check_lengths(lengths)
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
        prompts.append(ids[start:start + length])
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
        Decode's shape is the cache length; with ``compile_prefill`` each (padded prompt, cache) length pair is one more."""
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
        return steady_median(r.seconds for r in self.requests if r.new_graphs == 0)

    def summary(self) -> dict:
        """The run's figures as a dict (the benchmark's JSON and notebook 03's table)."""
        return {"label": self.label, "requests": len(self.requests), "graphs": self.graphs,
                "distinct_shapes": self.distinct_shapes, "compile_seconds": self.compile_seconds,
                "recompile_limit_hits": self.tracker.recompile_limit_hits,
                "first_request_seconds": self.requests[0].seconds if self.requests else None,
                "steady_request_seconds": self.steady_seconds(),
                "steady_tokens_per_second": self.tokens_per_second(),
                "pad_tokens": sum(r.padded_length - r.prompt_length for r in self.requests)}

    def describe(self) -> str:
        """One line: requests, graphs for distinct shapes, pad tokens and steady tokens per second."""
        figures = self.summary()
        text = (f"{self.label}: {figures['requests']} request(s), {figures['graphs']} graph(s) for "
                f"{figures['distinct_shapes']} distinct shape(s), {figures['pad_tokens']} pad token(s)")
        if figures["steady_tokens_per_second"] is not None:
            text += f", {figures['steady_tokens_per_second']:.1f} new tokens/s at steady state"
        return text


def run_generation_workload(model, prompts: Prompts, max_new_tokens: int, *, tokenizer=None,
                            buckets: ShapeBuckets | None = None, compile: bool = True,
                            backend: str | None = None, compile_prefill: bool = False,
                            pad_token_id: int | None = None, recompile_limit: int | None = None,
                            label: str | None = None) -> WorkloadResult:
    """Greedy static-cache generation for each prompt in turn, tracking graphs per request; a :class:`WorkloadResult`.
    With ``buckets`` each prompt goes through :func:`trnlab.bucketed_generate`; ``compile=False`` disables compiling;
    ``recompile_limit`` raises dynamo's graphs-per-function limit so every shape counts."""
    requests = prompt_token_ids(prompts, tokenizer)
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
    result = WorkloadResult(label or ("bucketed" if buckets else "unbucketed"), compile_prefill=compile_prefill)
    with raised_recompile_limit(recompile_limit), result.tracker as tracker:
        for i, ids in enumerate(requests):
            with tracker.call(f"request {i}"):
                output = _generate_request(model, ids, max_new_tokens, buckets=buckets, compile=compile,
                                           backend=backend, compile_prefill=compile_prefill,
                                           pad_token_id=pad_token_id)
            result.requests.append(_request_record(model, ids, output, tracker.calls[-1], buckets))
    return result


def _generate_request(model, ids: list[int], max_new_tokens: int, *, buckets, compile, backend, compile_prefill,
                      pad_token_id):
    # One request of run_generation_workload: through the buckets, or straight to generate().
    input_ids = torch.tensor([ids])
    if buckets is not None:
        return bucketed_generate(model, input_ids, buckets=buckets, pad_token_id=pad_token_id, compile=compile,
                                 backend=backend, compile_prefill=compile_prefill, max_new_tokens=max_new_tokens)
    return model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                          max_new_tokens=max_new_tokens, cache_implementation="static", pad_token_id=pad_token_id,
                          **generate_compile_kwargs(model, compile, backend, compile_prefill))


def _request_record(model, ids: list[int], output, call, buckets) -> RequestRecord:
    # What one request cost and answered, from its tracked call.
    length = len(ids)
    return RequestRecord(
        prompt_length=length,
        padded_length=buckets.bucket_for(length) if buckets is not None else length,
        # the static cache length generate() used (it keeps the largest so far on the model)
        cache_length=compat.generate_cache_length(model),
        new_tokens=output[0, length:].tolist(), seconds=call.seconds,
        new_graphs=call.new_graphs, compile_seconds=call.compile_seconds)


def identical_outputs(a: WorkloadResult, b: WorkloadResult) -> bool:
    """Whether two runs over the same prompts generated exactly the same tokens."""
    return a.outputs == b.outputs
