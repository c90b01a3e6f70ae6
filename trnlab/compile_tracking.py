"""Count the graphs ``torch.compile`` builds and the seconds it spends, around any code; notebook 03's workloads.
On Trainium every new input shape compiles a new graph (a NEFF); the counts are dynamo's, for the whole process."""

from __future__ import annotations

import contextlib
import logging
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import torch

from trnlab import _compat
from trnlab.assets.corpus import generate_documents
from trnlab.generation import ShapeBuckets, _generate_compile_kwargs, _lengths, _prompt_token_ids, bucketed_generate
from trnlab.settings import SettingError

__all__ = ["CompileTracker", "WorkloadResult", "corpus_prompts", "forget_compiled_graphs", "identical_outputs",
           "recompile_log", "run_generation_workload", "sample_prompt_lengths", "time_generation", "timings_differ"]


def _steady_median(seconds) -> float | None:
    """The median of ``seconds``, the times of calls or steps that compiled nothing (``None`` if none)."""
    seconds = list(seconds)
    return statistics.median(seconds) if seconds else None


def _counters() -> tuple[int, float, int]:
    """Graphs, compile seconds and recompile-limit hits so far (past the limit a function runs eagerly, uncounted)."""
    return _compat.dynamo_unique_graphs(), _compat.dynamo_compile_seconds(), _compat.dynamo_recompile_limit_hits()


def forget_compiled_graphs(model=None) -> None:
    """Forget every graph compiled in this process, and with ``model`` the compiled forward and cache length kept on it.
    On Trainium the NEFF cache on disk still holds them (``TORCH_NEURONX_NEFF_DISABLE_CACHE=1``, in a new process)."""
    _compat.dynamo_reset()
    if model is not None:
        _compat.forget_generate_state(model)


@contextlib.contextmanager
def recompile_log():
    """Collect dynamo's recompile messages inside the block (why each graph compiled again), paths shortened.
    Turn the log on first with ``torch._logging.set_logs(recompiles=True)``, else the list stays empty (a warning)."""
    logger = _compat.dynamo_recompiles_logger()
    if not logger.isEnabledFor(logging.DEBUG):
        warnings.warn("dynamo's recompile log is off, so nothing will be collected: call "
                      "torch._logging.set_logs(recompiles=True) first", UserWarning, stacklevel=3)
    messages: list[str] = []
    handler, propagate = logging.Handler(), logger.propagate
    handler.emit = lambda record: messages.append(_shorten_paths(record.getMessage()))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _shorten_paths(text: str) -> str:
    """Replace each ``.../site-packages/`` prefix with ``<site-packages>/`` (no machine paths)."""
    return re.sub(r"(?:[A-Za-z]:)?[^\s'\"]*[/\\](?:site|dist)-packages[/\\]", "<site-packages>/", text)


def _recompile_limit(limit: int | None):
    """Set dynamo's limit of graphs per function (8) inside the block (higher: every shape counts); ``None``: as is."""
    return contextlib.nullcontext() if limit is None else _compat.dynamo_recompile_limit(limit)


@dataclass
class _CallRecord:
    """One timed call: its label, wall seconds, graphs compiled and seconds compiling during it."""

    label: str
    seconds: float
    new_graphs: int
    compile_seconds: float


class CompileTracker:
    """Context manager: graphs compiled and compile seconds inside its block (``with tracker.call(name):`` times one).
    Live inside the block, frozen at its end, new on each entry; ``str()`` is one line, :meth:`summary` the figures."""

    def __init__(self):
        self.calls: list[_CallRecord] = []
        self._start = self._end = None  # counters at the block's start and end (None: not yet)
        self._open = False

    def __enter__(self) -> CompileTracker:
        if self._open:
            raise RuntimeError("this CompileTracker is already inside its with block: nested in itself it "
                               "would miscount. Use a second CompileTracker() for the inner block")
        self.calls, self._start, self._end, self._open = [], _counters(), None, True
        return self

    def __exit__(self, *exc) -> None:
        self._end, self._open = _counters(), False

    def _delta(self, i: int, what: str):
        if self._start is None:
            raise RuntimeError(f"CompileTracker.{what} is read before the tracker's with block: it would count "
                               "every graph this process ever compiled. Use it as "
                               "`with CompileTracker() as tracker: ...` and read it inside or after the block")
        return (self._end or _counters())[i] - self._start[i]

    @property
    def graphs(self) -> int:
        """Graphs compiled inside the block."""
        return self._delta(0, "graphs")

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling inside the block."""
        return self._delta(1, "compile_seconds")

    @property
    def recompile_limit_hits(self) -> int:
        """Functions dynamo stopped compiling inside the block, because they recompiled too often."""
        return self._delta(2, "recompile_limit_hits")

    @contextlib.contextmanager
    def call(self, label: str = "call"):
        """Inside the tracker's ``with`` block: time the code inside, with the graphs it compiled and their seconds."""
        if not self._open:
            raise RuntimeError("CompileTracker.call() works only inside the tracker's with block: "
                               "`with CompileTracker() as tracker: with tracker.call(...): ...`")
        (graphs, seconds, _), start = _counters(), time.perf_counter()
        try:
            yield
        finally:
            now = _counters()
            self.calls.append(_CallRecord(label, time.perf_counter() - start, now[0] - graphs, now[1] - seconds))

    def summary(self) -> dict:
        """The block's figures: graphs, compile seconds, calls, the first call's and the steady calls' median time."""
        steady = [c.seconds for c in self.calls if c.new_graphs == 0]
        return {"graphs": self.graphs, "compile_seconds": self.compile_seconds, "calls": len(self.calls),
                "first_call_seconds": self.calls[0].seconds if self.calls else None,
                "steady_seconds": _steady_median(steady), "steady_calls": len(steady),
                "recompile_limit_hits": self.recompile_limit_hits}

    def __str__(self) -> str:
        figures = self.summary()
        text = f"{figures['graphs']} graph(s) compiled, {figures['compile_seconds']:.2f} s compiling"
        if self.calls:
            text += f"; first call {figures['first_call_seconds']:.3f} s"
            if figures["steady_seconds"] is not None:
                text += f", steady state {figures['steady_seconds']:.3f} s (median of {figures['steady_calls']})"
        if figures["recompile_limit_hits"]:
            text += (f"; dynamo hit its recompile limit {figures['recompile_limit_hits']} time(s), so later "
                     "shapes ran eagerly (raise torch._dynamo.config.recompile_limit, or bucket shapes)")
        return text


def time_generation(model, inputs: dict, repeats: int = 3, label: str = "generate", **generate_kwargs) -> dict:
    """Time ``repeats`` calls of ``model.generate(**inputs, **generate_kwargs)``, and count their graphs.
    The first call's seconds (compiling included), the later ones', their median and new tokens/s (timings_differ)."""
    with CompileTracker() as tracker:
        for _ in range(repeats):
            with tracker.call(label):
                output = model.generate(**inputs, **generate_kwargs)
    new_tokens = output.shape[0] * (output.shape[1] - inputs["input_ids"].shape[1])
    later = [c.seconds for c in tracker.calls[1:]]
    steady = _steady_median(later)
    return {"label": label, "graphs": tracker.graphs, "compile_seconds": tracker.compile_seconds,
            "first_call_seconds": tracker.calls[0].seconds, "steady_seconds": steady,
            "steady_tokens_per_second": new_tokens / steady if steady else None,
            "steady_call_seconds": later, "new_tokens": new_tokens}


def timings_differ(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two sets of repeated timings are apart, every time of one below every time of the other (else noise)."""
    a, b = list(a), list(b)
    if not a or not b:
        raise SettingError("timings_differ needs at least one time on each side (time_generation with repeats >= 2)")
    return max(a) < min(b) or max(b) < min(a)


def sample_prompt_lengths(n: int, shortest: int, longest: int, seed: int = 0) -> list[int]:
    """``n`` prompt lengths drawn uniformly between ``shortest`` and ``longest`` tokens (seeded)."""
    if n < 1 or shortest < 1 or longest < shortest:
        raise SettingError(f"need n >= 1 and 1 <= shortest <= longest, got n={n}, {shortest}..{longest}")
    rng = random.Random(seed)
    return [rng.randint(shortest, longest) for _ in range(n)]


def corpus_prompts(tokenizer, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    """One prompt of exactly each length, cut from the course corpus at a seeded offset, as token-id lists."""
    lengths = _lengths(lengths)
    rng = random.Random(seed)
    ids: list[int] = []
    documents = 0
    while len(ids) < 4 * max(lengths):
        documents += 50
        # document by document: one long string would trip the tokenizer's max-length warning
        texts = generate_documents(documents, seed)
        ids = [i for n, text in enumerate(texts) for i in tokenizer((" " if n else "") + text)["input_ids"]]
    starts = [rng.randrange(0, len(ids) - length) for length in lengths]
    return [ids[start:start + length] for start, length in zip(starts, lengths)]


@dataclass
class _RequestRecord(_CallRecord):
    """One request of a workload: its timed call, lengths and new tokens."""

    prompt_length: int
    padded_length: int
    cache_length: int | None
    new_tokens: list[int]

    def shapes(self, compile_prefill: bool) -> set:
        """The static shapes its compiled forward saw: decode at the cache length, and prefill if compiled."""
        prefill = {("prefill", self.padded_length, self.cache_length)} if compile_prefill else set()
        return {("decode", self.cache_length)} | prefill


@dataclass
class WorkloadResult:
    """One :func:`run_generation_workload` run: its requests, their tracker, its :meth:`summary` and :meth:`table`."""

    label: str
    requests: list[_RequestRecord] = field(default_factory=list)
    tracker: CompileTracker = field(default_factory=CompileTracker)
    compile_prefill: bool = False

    @property
    def graphs(self) -> int:
        return self.tracker.graphs

    @property
    def distinct_shapes(self) -> int:
        """Distinct static shapes the compiled forward saw: what ``graphs`` should equal."""
        return len(set().union(*(r.shapes(self.compile_prefill) for r in self.requests)))

    def table(self) -> list[dict]:
        """One row per request: lengths, new graphs, seconds, and running totals (for plots)."""
        rows, seen, graphs, seconds = [], set(), 0, 0.0
        for i, r in enumerate(self.requests):
            seen |= r.shapes(self.compile_prefill)
            graphs += r.new_graphs
            seconds += r.compile_seconds
            rows.append({"request": i, "prompt_length": r.prompt_length, "padded_length": r.padded_length,
                         "cache_length": r.cache_length, "new_tokens": len(r.new_tokens),
                         "new_graphs": r.new_graphs, "seconds": r.seconds, "compile_seconds": r.compile_seconds,
                         "graphs_so_far": graphs, "shapes_so_far": len(seen), "compile_seconds_so_far": seconds})
        return rows

    def tokens_per_second(self) -> float | None:
        """New tokens per second over the requests that compiled nothing."""
        chosen = [r for r in self.requests if r.new_graphs == 0]
        seconds = sum(r.seconds for r in chosen)
        return sum(len(r.new_tokens) for r in chosen) / seconds if chosen and seconds > 0 else None

    def summary(self) -> dict:
        """The run's figures as a dict (the benchmark's JSON and notebook 03's table)."""
        return {"label": self.label, "requests": len(self.requests), "graphs": self.graphs,
                "distinct_shapes": self.distinct_shapes, "compile_seconds": self.tracker.compile_seconds,
                "recompile_limit_hits": self.tracker.recompile_limit_hits,
                "first_request_seconds": self.requests[0].seconds if self.requests else None,
                "steady_request_seconds": _steady_median(r.seconds for r in self.requests if r.new_graphs == 0),
                "steady_tokens_per_second": self.tokens_per_second(),
                "pad_tokens": sum(r.padded_length - r.prompt_length for r in self.requests)}


def run_generation_workload(model, prompts, max_new_tokens: int, *, tokenizer=None, buckets: ShapeBuckets | None = None,
                            compile: bool = True, backend: str | None = None, compile_prefill: bool = False,
                            recompile_limit: int | None = None, label: str | None = None) -> WorkloadResult:
    """Greedy static-cache generation for each prompt in turn, graphs counted per request: a :class:`WorkloadResult`.
    With ``buckets`` through :func:`bucketed_generate`; ``recompile_limit`` sets dynamo's for the run."""
    result = WorkloadResult(label or ("bucketed" if buckets else "unbucketed"), compile_prefill=compile_prefill)
    with _recompile_limit(recompile_limit), result.tracker as tracker:
        for i, ids in enumerate(_prompt_token_ids(prompts, tokenizer)):
            with tracker.call(f"request {i}"):
                if buckets is None:
                    prompt = torch.tensor([ids])
                    output = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                            max_new_tokens=max_new_tokens, cache_implementation="static",
                                            **_generate_compile_kwargs(model, compile, backend, compile_prefill))
                else:
                    output = bucketed_generate(model, [ids], buckets=buckets, compile=compile, backend=backend,
                                               compile_prefill=compile_prefill, max_new_tokens=max_new_tokens)
            result.requests.append(_RequestRecord(
                **vars(tracker.calls[-1]), prompt_length=len(ids), new_tokens=output[0, len(ids):].tolist(),
                padded_length=len(ids) if buckets is None else buckets.bucket_for(len(ids)),
                cache_length=_compat.generate_cache_length(model)))  # the largest so far, kept on the model
    return result


def identical_outputs(a: WorkloadResult, b: WorkloadResult) -> bool:
    """Whether two runs over the same prompts generated exactly the same tokens."""
    return [r.new_tokens for r in a.requests] == [r.new_tokens for r in b.requests]
