"""Count the graphs ``torch.compile`` builds, and the time spent compiling, around any code.

On Trainium every new input shape compiles a new graph (a NEFF), which can take minutes.
:class:`CompileTracker` makes that visible for any backend: ``"neuron"`` on Trainium,
``inductor`` or ``aot_eager`` elsewhere. It reads dynamo's own process-wide counters, not
state on a backend object: ``CompileConfig.to_dict()`` deep-copies a callable backend, so
counters kept on such an object would be lost. Notebooks 03, 04 and 05 use it.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from trnlab import compat
from trnlab.deprecation import SummaryDict, warn_deprecated as _deprecated
from trnlab.device import NEFF_CACHE_VAR
from trnlab.settings import environment

__all__ = [
    "CAPTURE_ONLY_BACKENDS", "DEFAULT_OFF_NEURON_BACKEND", "NEFF_DISABLE_CACHE_VAR", "CallRecord", "CompileTracker",
    "cold_neff_cache_env", "compile_backend", "compile_seconds", "forget_compiled_graphs", "generation_compile_config",
    "graphs_compiled", "neuron_graph_metrics", "recompile_limit", "recompile_limit_hits",
    "recompile_log", "steady_median",
]


def steady_median(seconds) -> float | None:
    """The median of ``seconds``, the times of calls or steps that compiled nothing (``None`` if none).

    The one definition of "steady state" in trnlab: :attr:`CompileTracker.steady_seconds`, the
    training recorder, the workload harness and :func:`trnlab.bench.timing.time_generation` use it.
    """
    seconds = list(seconds)
    return statistics.median(seconds) if seconds else None


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (all backends)."""
    return compat.dynamo_unique_graphs()


def compile_seconds() -> float:
    """Seconds dynamo has spent compiling in this process so far (tracing + backend)."""
    return compat.dynamo_compile_seconds()


def recompile_limit_hits() -> int:
    """Times dynamo gave up compiling a function in this process because it recompiled too often.

    Past ``torch._dynamo.config.recompile_limit`` (8 by default) graphs for one function,
    dynamo stops compiling it and runs every later new shape eagerly: the count of graphs
    stops growing, and so does the speed. A non-zero value here means the graph count
    understates what the workload would have compiled.
    """
    return compat.dynamo_recompile_limit_hits()


def neuron_graph_metrics() -> list | None:
    """``torch.neuron.get_dynamo_metrics()`` on Trainium (one entry per NEFF), else ``None``."""
    getter = getattr(getattr(torch, "neuron", None), "get_dynamo_metrics", None)
    return list(getter()) if getter is not None else None


def forget_compiled_graphs(model=None) -> None:
    """Forget every graph compiled in this process, so the next run starts cold like a new one.

    ``torch._dynamo.reset()`` drops compiled graphs. ``generate()`` also keeps, on ``model``,
    its compiled forward and the largest static-cache length used so far (shorter prompts
    reuse it): pass the model to forget those too. Without it a second experiment would reuse
    the first one's graphs and count 0. On Trainium the NEFF cache on disk still holds the
    compiled graphs, so the compiler's time is saved (see :func:`cold_neff_cache_env`).
    Notebooks 03 and 04 call it between experiments.
    """
    compat.dynamo_reset()
    if model is not None:
        compat.forget_generate_state(model)


def reset_compile_state(model=None) -> None:
    """Deprecated name of :func:`forget_compiled_graphs`."""
    _deprecated("reset_compile_state", "trnlab.forget_compiled_graphs(model)")
    forget_compiled_graphs(model)


#: TorchNeuron's switch that turns its on-disk NEFF cache off (read once per process).
NEFF_DISABLE_CACHE_VAR = "TORCH_NEURONX_NEFF_DISABLE_CACHE"


def cold_neff_cache_env() -> dict[str, str]:
    """Environment variables that make a *new* process compile every Neuron graph again.

    TorchNeuron keeps compiled graphs (NEFFs) on disk (``TORCH_NEURONX_NEFF_CACHE_DIR``,
    default ``/tmp/neff_cache``), so a re-run loads them instead of compiling: the cache stays
    warm, which is what you want. For a cold start, as on a fresh machine, start a new process
    with these variables (``{"TORCH_NEURONX_NEFF_DISABLE_CACHE": "1"}``):
    ``subprocess.run(cmd, env={**os.environ, **trnlab.cold_neff_cache_env()})`` or
    ``trnlab.launch(script, env=trnlab.cold_neff_cache_env())``. TorchNeuron reads its cache
    settings when its cache backend is built, at the first compile: changing them later in a
    running process (a notebook kernel) has no effect. Off Trainium nothing reads them. (The
    variable and when it is read come from a pre-release TorchNeuron source snapshot, not the
    official docs.)
    """
    return {NEFF_DISABLE_CACHE_VAR: "1"}


def fresh_neff_cache(enabled: bool = True):
    """Deprecated: it could not empty TorchNeuron's NEFF cache in a running process.

    It pointed ``TORCH_NEURONX_NEFF_CACHE_DIR`` at an empty temporary folder inside the block
    (still does, for processes started inside it), but TorchNeuron reads the variable once,
    when its cache backend is built. Use :func:`cold_neff_cache_env` for a new process.
    """
    _deprecated("fresh_neff_cache", "nothing (the NEFF cache stays warm), or for a cold start run the code in a "
                "new process with env={**os.environ, **trnlab.cold_neff_cache_env()},")
    return _temporary_neff_cache_dir(enabled)


@contextmanager
def _temporary_neff_cache_dir(enabled: bool):
    import shutil
    import tempfile

    if not enabled:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="trnlab-neff-")
    try:
        with environment(**{NEFF_CACHE_VAR: folder}):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def recompile_log():
    """Collect dynamo's recompile messages inside the block: why each graph was compiled again.

    Turn the log on first, with ``torch._logging.set_logs(recompiles=True)`` (or
    ``TORCH_LOGS=recompiles`` before Python starts). Yields a list that fills with one message
    per recompilation, e.g. ``"Recompiling function f in <site-packages>/...: tensor 'x' size
    mismatch at index 0. expected 2, actual 3"`` (site-packages paths shortened). Inside the
    block the messages are collected instead of printed; with the log off the list stays empty
    and a warning says how to turn it on. Notebook 03 shows it.
    """
    import logging
    import warnings

    logger = compat.dynamo_recompiles_logger()
    if not logger.isEnabledFor(logging.DEBUG):
        warnings.warn("dynamo's recompile log is off, so nothing will be collected: call "
                      "torch._logging.set_logs(recompiles=True) first", UserWarning, stacklevel=3)
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(_shorten_paths(record.getMessage()))

    handler, propagate = Collect(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _shorten_paths(text: str) -> str:
    """Replace each ``.../site-packages/`` prefix with ``<site-packages>/`` (no machine paths)."""
    import re

    return re.sub(r"(?:[A-Za-z]:)?[^\s'\"]*[/\\](?:site|dist)-packages[/\\]", "<site-packages>/", text)


@contextmanager
def recompile_limit(limit: int | None):
    """Raise dynamo's limit of graphs per function (8) inside the block; ``None`` changes nothing.

    Past the limit dynamo stops compiling and runs new shapes eagerly, so a count of graphs
    would stop at 8: the course raises it to count every shape, as Neuron would compile it.
    """
    if limit is None:
        yield
        return
    with compat.dynamo_recompile_limit(limit):
        yield


#: Backends that are not real compilers: dynamo captures the graphs and runs them eagerly.
CAPTURE_ONLY_BACKENDS = ("eager", "aot_eager")


#: The course's backend off Neuron: dynamo captures and counts every graph (a new one per new
#: shape, as on Neuron), then runs it as ordinary PyTorch, so counting is cheap and compiled
#: tokens equal eager ones. Ask for ``"inductor"`` (or any backend) to optimise the graphs.
DEFAULT_OFF_NEURON_BACKEND = "eager"


def compile_backend(device: torch.device | str, requested: str | None = None, *,
                    cpu_default: str | None = None) -> str:
    """The ``torch.compile`` backend to use on ``device``: decided here, and only here.

    * On Neuron: ``"neuron"``, the backend that builds Trainium graphs (Transformers picks it
      too). Asking for another one there raises ``ValueError``: inductor and the others
      cannot compile for a NeuronCore.
    * Elsewhere (CPU and GPUs alike): ``requested`` if given, else ``"eager"``
      (:data:`DEFAULT_OFF_NEURON_BACKEND`): the same graphs and recompiles, counted in seconds,
      with the same tokens as without compiling. Pass ``requested="inductor"`` for speed.

    ``cpu_default`` is deprecated (it set the CPU default, now ``"eager"``): pass
    ``requested`` instead. Used by :func:`generation_compile_config`, notebooks 03 and 04 and
    both benchmarks, so the Python API and the CLI agree.
    """
    if cpu_default is not None:
        _deprecated("compile_backend(..., cpu_default=...)",
                    "trnlab.compile_backend(device, requested) (off Neuron the default is now 'eager')")
    device_type = torch.device(device).type
    if device_type == "neuron":
        if requested not in (None, "neuron"):
            raise ValueError(f"backend {requested!r} cannot compile for a NeuronCore: on Neuron use "
                             "backend='neuron' (or leave it unset)")
        return "neuron"
    if requested:
        return requested
    if cpu_default is not None and device_type == "cpu":
        return cpu_default
    return DEFAULT_OFF_NEURON_BACKEND


def generation_compile_config(device: torch.device | str, backend: str | None = None):
    """The ``compile_config`` that makes ``generate()`` compile like it does on Neuron.

    On Neuron it returns ``None``: Transformers already compiles the static-cache forward
    there with ``CompileConfig(backend="neuron", dynamic=False, mode="default")``, so leave
    it alone. Anywhere else it returns that same config with :func:`compile_backend`'s
    choice and compiling allowed on every device (without it ``generate()`` compiles only on
    cuda/xpu/neuron/tpu, never on CPU). ``dynamic=False`` makes every new shape a new graph,
    as on Neuron. Pass it as ``generate(..., compile_config=...)``; notebook 03 does.
    """
    from transformers import CompileConfig

    chosen = compile_backend(device, backend)
    if chosen == "neuron":
        return None
    config = CompileConfig(backend=chosen, dynamic=False, mode="default")
    compat.compile_on_every_device(config)
    return config


@dataclass
class CallRecord:
    """One timed call: its label, wall seconds, graphs compiled and seconds compiling during it."""

    label: str
    seconds: float
    new_graphs: int
    compile_seconds: float = 0.0


@dataclass
class CompileTracker:
    """Context manager: graphs compiled and compile seconds inside its block.

    >>> with CompileTracker() as tracker:
    ...     for batch in batches:
    ...         with tracker.call("generate"):
    ...             model.generate(**batch)
    >>> print(tracker.describe())

    Values are live inside the block and frozen at its end. ``calls`` holds one
    :class:`CallRecord` per :meth:`call`; calls that compiled nothing are the steady state.
    A tracker measures one block at a time: entering it again after its block ends starts a
    new measurement (``calls`` cleared, counts from zero). Nesting it in itself, or reading
    its counts before its first ``with``, raises ``RuntimeError`` rather than miscount; use a
    second ``CompileTracker`` for an inner block (different trackers nest freely).
    """

    calls: list[CallRecord] = field(default_factory=list)
    _start_graphs: int = 0
    _start_seconds: float = 0.0
    _start_neuron: int = 0
    _start_limit_hits: int = 0
    _end: tuple[int, float, int] | None = None
    _end_limit_hits: int | None = None
    _state: str = "new"  # "new" -> "open" (inside the with block) -> "closed"

    def __enter__(self) -> CompileTracker:
        if self._state == "open":
            raise RuntimeError("this CompileTracker is already inside its with block: nested in itself it "
                               "would miscount. Use a second CompileTracker() for the inner block")
        self.calls = []  # a new measurement: nothing from an earlier block, its end counts included
        self._end, self._end_limit_hits = None, None
        self._start_graphs, self._start_seconds = graphs_compiled(), compile_seconds()
        self._start_neuron = len(neuron_graph_metrics() or [])
        self._start_limit_hits = recompile_limit_hits()
        self._state = "open"
        return self

    def __exit__(self, *exc) -> None:
        self._end = (graphs_compiled(), compile_seconds(), len(neuron_graph_metrics() or []))
        self._end_limit_hits = recompile_limit_hits()
        self._state = "closed"

    def _check_started(self, what: str) -> None:
        if self._state == "new":
            raise RuntimeError(f"CompileTracker.{what} is read before the tracker's with block: it would count "
                               "every graph this process ever compiled. Use it as "
                               "`with CompileTracker() as tracker: ...` and read it inside or after the block")

    def _now(self) -> tuple[int, float, int]:
        self._check_started("graphs / compile_seconds")
        return self._end or (graphs_compiled(), compile_seconds(), len(neuron_graph_metrics() or []))

    @property
    def graphs(self) -> int:
        """Graphs compiled inside the block."""
        return self._now()[0] - self._start_graphs

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling inside the block."""
        return self._now()[1] - self._start_seconds

    @property
    def neuron_graphs(self) -> int | None:
        """NEFFs the Neuron backend reports for the block (``None`` off Trainium)."""
        self._check_started("neuron_graphs")
        return None if neuron_graph_metrics() is None else self._now()[2] - self._start_neuron

    @property
    def recompile_limit_hits(self) -> int:
        """Functions dynamo stopped compiling inside the block (see :func:`recompile_limit_hits`)."""
        self._check_started("recompile_limit_hits")
        end = self._end_limit_hits if self._end_limit_hits is not None else recompile_limit_hits()
        return end - self._start_limit_hits

    @contextmanager
    def call(self, label: str = "call"):
        """Time the code inside and record how many graphs it compiled, and the seconds that took.

        Only inside the tracker's ``with`` block (``RuntimeError`` otherwise): a call outside it
        would be listed but not counted in :attr:`graphs`.
        """
        if self._state != "open":
            raise RuntimeError("CompileTracker.call() works only inside the tracker's with block: "
                               "`with CompileTracker() as tracker: with tracker.call(...): ...`")
        graphs, seconds, start = graphs_compiled(), compile_seconds(), time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.calls.append(CallRecord(label, elapsed, graphs_compiled() - graphs, compile_seconds() - seconds))

    @property
    def first_call_seconds(self) -> float | None:
        return self.calls[0].seconds if self.calls else None

    @property
    def steady_seconds(self) -> float | None:
        """Median time of the calls that compiled nothing (``None`` if every call compiled)."""
        return steady_median(c.seconds for c in self.calls if c.new_graphs == 0)

    def summary(self) -> dict:
        """The block's figures as a dict: graphs, compile seconds, calls, first call and steady state.

        Until trnlab 0.3 the dict also behaves like :meth:`describe`'s text where a string was
        expected (``print``, ``str``, ``+``, ``in``, ``==``, string methods), with a
        ``FutureWarning`` for all but ``print``/``str``: ``summary()`` returned that text before.
        """
        steady = sum(c.new_graphs == 0 for c in self.calls)
        return SummaryDict("CompileTracker", self.describe(), {
            "graphs": self.graphs, "compile_seconds": self.compile_seconds, "calls": len(self.calls),
            "first_call_seconds": self.first_call_seconds, "steady_seconds": self.steady_seconds,
            "steady_calls": steady, "recompile_limit_hits": self.recompile_limit_hits})

    def describe(self) -> str:
        """One line: graphs, compile seconds, first call and steady-state time."""
        text = f"{self.graphs} graph(s) compiled, {self.compile_seconds:.2f} s compiling"
        if self.calls:
            text += f"; first call {self.first_call_seconds:.3f} s"
            if self.steady_seconds is not None:
                n = sum(c.new_graphs == 0 for c in self.calls)
                text += f", steady state {self.steady_seconds:.3f} s (median of {n})"
        if self.recompile_limit_hits:
            text += (f"; dynamo hit its recompile limit {self.recompile_limit_hits} time(s), so later "
                     "shapes ran eagerly (raise torch._dynamo.config.recompile_limit, or bucket shapes)")
        return text

    def table(self) -> list[dict]:
        """One row per call: label, seconds, new graphs, graphs so far, compile seconds (and so far)."""
        rows, total, total_seconds = [], 0, 0.0
        for i, c in enumerate(self.calls):
            total += c.new_graphs
            total_seconds += c.compile_seconds
            rows.append({"call": i, "label": c.label, "seconds": c.seconds,
                         "new_graphs": c.new_graphs, "graphs_so_far": total,
                         "compile_seconds": c.compile_seconds, "compile_seconds_so_far": total_seconds})
        return rows

