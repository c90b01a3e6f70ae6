"""Shape bucketing: pad prompts to a few fixed lengths so a workload compiles a few graphs.

On Trainium every new input shape compiles a new graph (claims 2 and 9). Bucketing pads
each prompt up to the smallest of a few chosen lengths, so any stream of prompts compiles at
most one graph per bucket:

- :func:`bucket_for` and :class:`ShapeBuckets` say which bucket a prompt goes to, and the
  one static cache length every request uses;
- :func:`choose_buckets` picks the ``k`` bucket lengths that waste the fewest pad tokens,
  exactly (a dynamic programme), and :func:`padding_by_bucket_count` tabulates that against
  ``k`` for a plot;
- :func:`bucket_pad_tokens` counts the pad tokens a set of buckets adds.

Waste is always named the same way in trnlab: ``pad_tokens`` is a count, ``padding_waste``
a fraction of all tokens processed (pads included). Notebook 03 and
``python -m trnlab bench generate`` use this module; :func:`trnlab.bucketed_generate` runs
generation through a bucket.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from trnlab.deprecation import warn_deprecated as _deprecated

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

    Rejects strings, empty sequences, bools, floats and non-positive values; with
    ``max_positions`` (the model's ``max_position_embeddings``) also lengths beyond it.
    ``what`` names the argument in the message (``"prompt lengths"`` or ``"buckets"``).
    """
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

    Raises :class:`PromptTooLongError` when ``length`` exceeds every bucket: padding cannot
    shorten a prompt, and silently cutting it would change the answer.
    """
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


def choose_buckets(lengths: Iterable[int], k: int, max_positions: int | None = None, *,
                   max_length: int | None = None) -> tuple[int, ...]:
    """The at most ``k`` bucket lengths that minimise :func:`bucket_pad_tokens` for ``lengths``.

    ``lengths`` are the token counts of a sample of prompts, ``k`` the graph budget. An
    optimal bucket set uses only sample lengths (lowering a bucket to the longest prompt it
    holds only saves padding) and must contain the longest, so a dynamic programme over the
    sorted distinct lengths finds it exactly: ``best[m][j]`` is the least waste covering the
    first ``j + 1`` distinct lengths with ``m`` buckets, the last one at length ``j``. With
    ``k`` at least the number of distinct lengths every length is its own bucket (no waste).
    ``max_positions`` (e.g. ``max_position_embeddings``) rejects lengths the model cannot take
    (``max_length=``, its old name, still works with a ``FutureWarning``).
    Notebook 03 plots the waste against ``k``.
    """
    if max_length is not None:
        if max_positions is not None:
            raise TypeError("choose_buckets got max_positions and max_length (its old name): pass max_positions only")
        _deprecated("choose_buckets(max_length=...)", "choose_buckets(..., max_positions=...)")
        max_positions = max_length
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
    """For k = 1 .. ``max_k``: the chosen buckets, their ``pad_tokens`` and ``padding_waste``.

    ``padding_waste`` is pad tokens over all tokens the model processes (prompts + pads).
    Returns one dict per ``k``; notebook 03 plots it with :func:`trnlab.plot_padding_waste`.
    """
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

    Prompts are left-padded up to the smallest bucket that holds them, and every request
    gets a static cache of :attr:`cache_length` = longest bucket + ``max_new_tokens``. Then
    the decode step always has the same shapes (one graph), and the prefill one shape per
    bucket: at most one graph per bucket plus the decode graph, for any workload.
    """

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


# ---------------------------------------------------------------------------------------------
# Deprecated names (trnlab 0.1 had them in trnlab.generation); removed in trnlab 0.3
# ---------------------------------------------------------------------------------------------


def bucket_padding_tokens(lengths: Iterable[int], buckets: Sequence[int]) -> int:
    """Deprecated name of :func:`bucket_pad_tokens`."""
    _deprecated("bucket_padding_tokens", "trnlab.bucket_pad_tokens(lengths, buckets)")
    return bucket_pad_tokens(lengths, buckets)


def waste_by_bucket_count(lengths: Iterable[int], max_k: int) -> list[dict]:
    """Deprecated name of :func:`padding_by_bucket_count` (rows also keep the old keys
    ``padded_tokens`` and ``waste_fraction``, now ``pad_tokens`` and ``padding_waste``)."""
    _deprecated("waste_by_bucket_count", "trnlab.padding_by_bucket_count(lengths, max_k) and read its rows' "
                "pad_tokens and padding_waste (were padded_tokens and waste_fraction)")
    return [row | {"padded_tokens": row["pad_tokens"], "waste_fraction": row["padding_waste"]}
            for row in padding_by_bucket_count(lengths, max_k)]
