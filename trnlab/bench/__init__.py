"""Benchmarks: the workload harness, timing, and the ``python -m trnlab bench`` commands.

- :mod:`trnlab.bench.workload`: a seeded stream of prompts, one request at a time, with graphs
  counted per request (:func:`run_generation_workload`, :class:`WorkloadResult`);
- :mod:`trnlab.bench.timing`: first call against steady state (:func:`time_generation`,
  :func:`timings_differ`, :func:`steady_median`);
- :mod:`trnlab.bench.generate`: ``python -m trnlab bench generate``, compiled generation with and
  without shape bucketing (notebook 03 runs the same workloads);
- :mod:`trnlab.bench.train`: ``python -m trnlab bench train``, the training data strategies compared.

The harness's names are re-exported here (``trnlab.bench.run_generation_workload``).
"""

from __future__ import annotations

from trnlab.bench.timing import steady_median, time_generation, timings_differ
from trnlab.bench.workload import (RequestRecord, WorkloadResult, corpus_prompts, identical_outputs,
                                   run_generation_workload, sample_prompt_lengths)

__all__ = ["RequestRecord", "WorkloadResult", "corpus_prompts", "identical_outputs", "run_generation_workload",
           "sample_prompt_lengths", "steady_median", "time_generation", "timings_differ"]
