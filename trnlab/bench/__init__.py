"""Benchmarks: the workload harness, timing, and the ``python -m trnlab bench generate`` / ``train`` commands.
The harness's names are re-exported here (``trnlab.bench.run_generation_workload``)."""

from __future__ import annotations

from trnlab.bench.timing import steady_median, time_generation, timings_differ
from trnlab.bench.workload import (RequestRecord, WorkloadResult, corpus_prompts, identical_outputs,
                                   run_generation_workload, sample_prompt_lengths)

__all__ = ["RequestRecord", "WorkloadResult", "corpus_prompts", "identical_outputs", "run_generation_workload",
           "sample_prompt_lengths", "steady_median", "time_generation", "timings_differ"]
