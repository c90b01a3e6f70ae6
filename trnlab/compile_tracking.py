"""Count the graphs ``torch.compile`` builds, and the time spent compiling, around any code.
On Trainium every new input shape compiles a new graph (a NEFF), which can take minutes. Counts come from dynamo's
process-wide counters, not a backend object (``CompileConfig.to_dict()`` deep-copies a callable backend)."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from trnlab import compat

__all__ = [
    "CAPTURE_ONLY_BACKENDS", "DEFAULT_OFF_NEURON_BACKEND", "NEFF_DISABLE_CACHE_VAR", "CallRecord", "CompileTracker",
    "cold_neff_cache_env", "compile_backend", "compile_seconds", "forget_compiled_graphs", "generation_compile_config",
    "graphs_compiled", "neuron_graph_metrics", "recompile_limit", "recompile_limit_hits",
    "recompile_log", "steady_median",
]


def steady_median(seconds) -> float | None:
    """The median of ``seconds``, the times of calls or steps that compiled nothing (``None`` if none).
    trnlab's one definition of "steady state"."""
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
    Past ``torch._dynamo.config.recompile_limit`` (8) graphs a function runs eagerly, so non-zero means the graph count
    understates what the workload would have compiled."""
    return compat.dynamo_recompile_limit_hits()


def neuron_graph_metrics() -> list | None:
    """``torch.neuron.get_dynamo_metrics()`` on Trainium (one entry per NEFF), else ``None``."""
    getter = getattr(getattr(torch, "neuron", None), "get_dynamo_metrics", None)
    return list(getter()) if getter is not None else None


def forget_compiled_graphs(model=None) -> None:
    """Forget every graph compiled in this process, so the next run starts cold like a new one.
    Pass ``model`` to also drop ``generate()``'s compiled forward and static-cache length kept on it. On Trainium the
    on-disk NEFF cache still holds the graphs (see :func:`cold_neff_cache_env`)."""
    compat.dynamo_reset()
    if model is not None:
        compat.forget_generate_state(model)


#: TorchNeuron's switch that turns its on-disk NEFF cache off (read once per process).
NEFF_DISABLE_CACHE_VAR = "TORCH_NEURONX_NEFF_DISABLE_CACHE"


def cold_neff_cache_env() -> dict[str, str]:
    """Environment variables that make a *new* process compile every Neuron graph again (NEFF cache off).
    Pass them to a new process (``trnlab.launch(script, env=...)``): TorchNeuron reads them at its first compile, so a
    running kernel ignores them. Source: a pre-release TorchNeuron source snapshot."""
    return {NEFF_DISABLE_CACHE_VAR: "1"}


@contextmanager
def recompile_log():
    """Collect dynamo's recompile messages inside the block: why each graph was compiled again.
    Yields a list of messages (site-packages paths shortened); turn the log on first with
    ``torch._logging.set_logs(recompiles=True)``, else the list stays empty and a warning says so."""
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
    Past the limit dynamo runs new shapes eagerly, so a graph count would stop at 8."""
    if limit is None:
        yield
        return
    with compat.dynamo_recompile_limit(limit):
        yield


#: Backends that are not real compilers: dynamo captures the graphs and runs them eagerly.
CAPTURE_ONLY_BACKENDS = ("eager", "aot_eager")


#: The course's backend off Neuron: dynamo captures and counts every graph (one per new shape, as on Neuron),
#: then runs it as ordinary PyTorch, so counting is cheap and tokens equal eager ones.
DEFAULT_OFF_NEURON_BACKEND = "eager"


def compile_backend(device: torch.device | str, requested: str | None = None) -> str:
    """The ``torch.compile`` backend to use on ``device``: decided here, and only here.
    On Neuron ``"neuron"`` (another ``requested`` raises ``ValueError``); elsewhere ``requested``, else ``"eager"``
    (:data:`DEFAULT_OFF_NEURON_BACKEND`): the same graphs counted in seconds. Pass ``requested="inductor"`` for speed."""
    device_type = torch.device(device).type
    if device_type == "neuron":
        if requested not in (None, "neuron"):
            raise ValueError(f"backend {requested!r} cannot compile for a NeuronCore: on Neuron use "
                             "backend='neuron' (or leave it unset)")
        return "neuron"
    if requested:
        return requested
    return DEFAULT_OFF_NEURON_BACKEND


def generation_compile_config(device: torch.device | str, backend: str | None = None):
    """The ``compile_config`` that makes ``generate()`` compile like it does on Neuron.
    ``None`` on Neuron (Transformers already compiles there); elsewhere that config with :func:`compile_backend`'s choice,
    ``dynamic=False`` and compiling allowed on every device. Pass it as ``generate(..., compile_config=...)``."""
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
    """Context manager: graphs compiled and compile seconds inside its block (``with tracker.call(name):``).
    Values are live inside the block, frozen at its end; entering again starts a new measurement. Nesting a tracker in
    itself, or reading counts before its first ``with``, raises ``RuntimeError``: use a second tracker."""

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
        Only inside the tracker's ``with`` block (``RuntimeError`` otherwise)."""
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
        """The block's figures as a dict: graphs, compile seconds, calls, first call and steady state."""
        steady = sum(c.new_graphs == 0 for c in self.calls)
        return {
            "graphs": self.graphs, "compile_seconds": self.compile_seconds, "calls": len(self.calls),
            "first_call_seconds": self.first_call_seconds, "steady_seconds": self.steady_seconds,
            "steady_calls": steady, "recompile_limit_hits": self.recompile_limit_hits}

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

