"""Shape bucketing: pad prompts to a few fixed lengths so a workload compiles a few graphs.
On Trainium every new input shape compiles a new graph (claims 2 and 9); bucketed, a workload compiles at most one
graph per bucket. ``pad_tokens`` is a count, ``padding_waste`` a fraction of all tokens processed (pads included)."""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "PromptTooLongError", "ShapeBuckets", "bucket_for", "bucket_pad_tokens", "check_lengths", "choose_buckets",
    "padding_by_bucket_count",
]


#: What each empty sequence should have held, said in its error.
_WHAT_TO_PASS = {
    "prompt lengths": "pass the token counts of your prompts (a sample of them will do), e.g. [12, 40, 7]",
    "buckets": "pass at least one bucket length (padded prompt lengths in tokens), e.g. (32, 64, 128), "
               "or let trnlab.choose_buckets(prompt_lengths, k) pick them from your prompts' token counts",
}


def check_lengths(lengths: Iterable[int], max_positions: int | None = None, what: str = "prompt lengths") -> list[int]:
    """``lengths`` as a list of positive token counts, or a ``TypeError``/``ValueError`` saying what to pass.
    Also rejects lengths beyond ``max_positions`` (``max_position_embeddings``); ``what`` names the argument."""
    if isinstance(lengths, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of token counts, not a string")
    try:
        lengths = list(lengths)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of token counts (e.g. [12, 40, 7]), got "
                        f"{type(lengths).__name__}") from None
    if not lengths:
        raise ValueError(f"{what} is empty: {_WHAT_TO_PASS.get(what, 'pass at least one length')}")
    checked, bad = [], []
    for n in lengths:
        try:  # ints, numpy integers, 0-d integer tensors; never bools or floats
            value = operator.index(n) if not isinstance(n, bool) else -1
        except TypeError:
            value = -1
        (checked if value >= 1 else bad).append(value if value >= 1 else n)
    if bad:
        raise ValueError(f"{what} must be positive integers (token counts), got {bad[:5]}")
    if max_positions is not None and max(checked) > max_positions:
        raise ValueError(
            f"a length of {max(checked)} exceeds max_positions={max_positions} (the model's "
            "max_position_embeddings): truncate those prompts or use a model with a longer context")
    return checked


class PromptTooLongError(ValueError):
    """A prompt is longer than the longest bucket."""


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds a prompt of ``length`` tokens.
    Raises :class:`PromptTooLongError` when ``length`` exceeds every bucket: padding cannot shorten a prompt."""
    buckets = check_lengths(buckets, what="buckets")
    fitting = [b for b in buckets if b >= length]
    if not fitting:
        raise PromptTooLongError(
            f"a prompt of {length} tokens is longer than the longest bucket ({max(buckets)}): add a "
            f"bucket of at least {length} tokens, or pass truncate=True to keep its last "
            f"{max(buckets)} tokens")
    return min(fitting)


def bucket_pad_tokens(lengths: Iterable[int], buckets: Sequence[int]) -> int:
    """Pad tokens added when each prompt length is padded up to its bucket (see :func:`bucket_for`)."""
    lengths = check_lengths(lengths)
    buckets = sorted(check_lengths(buckets, what="buckets"))
    return sum(bucket_for(n, buckets) - n for n in lengths)


def choose_buckets(lengths: Iterable[int], k: int, max_positions: int | None = None) -> tuple[int, ...]:
    """The at most ``k`` bucket lengths that minimise :func:`bucket_pad_tokens` for ``lengths``.
    ``lengths`` is a sample of prompt lengths and ``k`` the graph budget; a dynamic programme over the sorted distinct
    lengths finds the optimum exactly. ``max_positions`` rejects lengths the model cannot take."""
    given = k
    try:
        k = -1 if isinstance(k, bool) else operator.index(k)
    except TypeError:
        k = -1
    if k < 1:
        raise ValueError(f"k is the number of buckets (graphs you accept to compile): a positive integer, "
                         f"got {given!r}")
    counts = sorted(Counter(check_lengths(lengths, max_positions)).items())
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


def padding_by_bucket_count(lengths: Iterable[int], max_k: int) -> list[dict]:
    """For k = 1 .. ``max_k``, one dict each: the chosen buckets, their ``pad_tokens`` and ``padding_waste``.
    ``padding_waste`` is pad tokens over all tokens the model processes (prompts + pads)."""
    lengths = check_lengths(lengths)
    rows = []
    for k in range(1, max_k + 1):
        buckets = choose_buckets(lengths, k)
        pads = bucket_pad_tokens(lengths, buckets)
        rows.append({"k": k, "buckets": buckets, "pad_tokens": pads,
                     "padding_waste": pads / (pads + sum(lengths))})
    return rows


@dataclass(frozen=True)
class ShapeBuckets:
    """The static shapes a bucketed workload compiles: prompt lengths and one cache length.
    Prompts are left-padded to the smallest bucket that holds them, with a static cache of :attr:`cache_length` =
    longest bucket + ``max_new_tokens``: at most one graph per bucket plus the decode graph."""

    lengths: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self):
        if isinstance(self.lengths, int):
            raise TypeError("lengths is a sequence of bucket lengths, e.g. (32, 64, 128), not one int")
        object.__setattr__(self, "lengths", tuple(sorted(set(check_lengths(self.lengths, what="buckets")))))
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

