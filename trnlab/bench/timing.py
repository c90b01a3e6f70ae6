"""Timing repeated calls: the first call against the steady state, and whether two timings differ."""

from __future__ import annotations

from typing import Sequence

from trnlab.compile_tracking import CompileTracker, steady_median

__all__ = ["steady_median", "time_generation", "timings_differ"]


def time_generation(model, inputs: dict, repeats: int = 3, label: str = "generate",
                    **generate_kwargs) -> dict:
    """Call ``model.generate(**inputs, **generate_kwargs)`` ``repeats`` times and time it.
    Returns the first call's seconds (compilation included), the median and list of the later calls, steady-state
    new tokens per second and the graphs compiled; compare two rows with :func:`timings_differ`."""
    new_tokens = 0
    with CompileTracker() as tracker:
        for _ in range(repeats):
            with tracker.call(label):
                output = model.generate(**inputs, **generate_kwargs)
            new_tokens = output.shape[0] * (output.shape[1] - inputs["input_ids"].shape[1])
    later = [c.seconds for c in tracker.calls[1:]]
    steady = steady_median(later)
    return {"label": label, "graphs": tracker.graphs, "compile_seconds": tracker.compile_seconds,
            "first_call_seconds": tracker.calls[0].seconds, "steady_seconds": steady,
            "steady_tokens_per_second": new_tokens / steady if steady else None,
            "steady_call_seconds": later, "new_tokens": new_tokens}


def timings_differ(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two sets of repeated timings are apart: every time of one below every time of the other.
    Overlapping ranges mean the difference is within the noise of these repeats."""
    a, b = list(a), list(b)
    if not a or not b:
        raise ValueError("timings_differ needs at least one time on each side (time_generation with repeats >= 2)")
    return max(a) < min(b) or max(b) < min(a)
