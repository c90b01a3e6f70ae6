"""Trainer callbacks: what happens per step, a live loss curve, and a stop for resuming.
Pass them to ``Trainer(..., callbacks=[...])``."""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from transformers import TrainerCallback

from trnlab.compile_tracking import CompileTracker, graphs_compiled, steady_median
from trnlab.plots import draw_loss_curve

__all__ = ["LiveLossPlot", "StepRecord", "StopAtStep", "TrainingRecorder"]


# Recording what happens per step


@dataclass
class StepRecord:
    """One optimizer step: loss, wall seconds, batch shape, tokens, graphs compiled."""

    step: int
    loss: float | None
    seconds: float
    shape: tuple[int, ...] | None
    real_tokens: int | None
    tokens: int | None
    new_graphs: int
    graphs_so_far: int
    compile_seconds_so_far: float


class _WatchedCollator:
    """Calls ``collator`` and hands each batch's shape and token counts to ``recorder``."""

    def __init__(self, collator, recorder: TrainingRecorder):
        self.collator, self.recorder = collator, recorder

    def __call__(self, rows):
        batch = self.collator(rows)
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        self.recorder._batches.append((tuple(batch["input_ids"].shape), real, batch["input_ids"].numel()))
        return batch


@dataclass
class TrainingRecorder(TrainerCallback):
    """Callback: per step, the loss, step time, batch shape and graphs compiled so far.
    Warm-up is the first ``warmup_steps`` optimizer steps; :attr:`graphs_after_warmup` is 0 for a static-shape run.
    Pass the collator as ``data_collator=recorder.watch(collator)`` so each step knows its batch shape."""

    warmup_steps: int = 1
    steps: list[StepRecord] = field(default_factory=list)
    tracker: CompileTracker = field(default_factory=CompileTracker)
    _batches: list = field(default_factory=list, repr=False)
    _step_start: float = 0.0
    _graphs_at_step_start: int = 0

    def watch(self, collator):
        """``collator``, wrapped so this recorder sees the shape and real tokens of every batch it builds."""
        return collator if isinstance(collator, _WatchedCollator) else _WatchedCollator(collator, self)

    # -- TrainerCallback hooks
    def on_train_begin(self, args, state, control, **kwargs):
        self.steps.clear()
        self._batches.clear()
        self.tracker.__enter__()

    def on_step_begin(self, args, state, control, **kwargs):
        self._graphs_at_step_start = self.tracker.graphs
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self._step_start
        graphs = self.tracker.graphs
        # Optimizer step i trains on micro-batches i*G .. (i+1)*G - 1 (G: gradient accumulation
        # steps). Matched by position, not by "batches seen so far": the data loader may have
        # collated the next step's first batch already.
        per_step = max(1, args.gradient_accumulation_steps)
        i = len(self.steps)
        mine = self._batches[i * per_step:(i + 1) * per_step]
        if mine:
            shape = mine[0][0] if len({b[0] for b in mine}) == 1 else max(b[0] for b in mine)
            real, tokens = sum(b[1] for b in mine), sum(b[2] for b in mine)
        else:
            shape, real, tokens = None, None, None
        self.steps.append(StepRecord(state.global_step, None, seconds, shape, real, tokens,
                                     graphs - self._graphs_at_step_start, graphs, self.tracker.compile_seconds))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self.steps and self.steps[-1].step == state.global_step:
            self.steps[-1].loss = float(logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self.tracker.__exit__(None, None, None)

    # -- results
    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps if s.loss is not None]

    @property
    def graphs(self) -> int:
        """Graphs compiled during training."""
        return self.tracker.graphs

    @property
    def graphs_after_warmup(self) -> int:
        """Graphs compiled after the first ``warmup_steps`` steps."""
        return sum(s.new_graphs for s in self.steps[self.warmup_steps:])

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Distinct batch shapes, in order of first appearance."""
        return list(dict.fromkeys(s.shape for s in self.steps if s.shape is not None))

    def _steady(self) -> list[StepRecord]:
        return [s for s in self.steps[self.warmup_steps:] if s.new_graphs == 0]

    @property
    def steady_step_seconds(self) -> float | None:
        """Median time of the steps after warm-up that compiled nothing (``None`` if none)."""
        return steady_median(s.seconds for s in self._steady())

    @property
    def padding_waste(self) -> float | None:
        """Fraction of pad tokens over all batches trained on."""
        counted = [s for s in self.steps if s.tokens]
        return 1 - sum(s.real_tokens for s in counted) / sum(s.tokens for s in counted) if counted else None

    @property
    def real_tokens_per_second(self) -> float | None:
        """Non-pad tokens per second over the steady steps (compiling steps excluded)."""
        steady = [s for s in self._steady() if s.real_tokens is not None]
        seconds = sum(s.seconds for s in steady)
        return sum(s.real_tokens for s in steady) / seconds if steady and seconds > 0 else None

    @property
    def total_seconds(self) -> float:
        """Wall seconds of all steps (compiling ones included)."""
        return sum(s.seconds for s in self.steps)

    @property
    def compiling_step_seconds(self) -> float:
        """Wall seconds of the steps that compiled a graph.
        Includes what dynamo's ``compile_seconds`` leaves out: the first backward and optimizer step, a lazy backward."""
        return sum(s.seconds for s in self.steps if s.new_graphs)

    @property
    def real_tokens_per_second_overall(self) -> float | None:
        """Non-pad tokens per second over all steps, compiling ones included."""
        counted = [s for s in self.steps if s.real_tokens is not None]
        seconds = sum(s.seconds for s in counted)
        return sum(s.real_tokens for s in counted) / seconds if counted and seconds > 0 else None

    def summary(self) -> dict:
        """The figures notebook 04's table and the benchmark report, as a dict."""
        return {
            "steps": len(self.steps),
            "shapes": len(self.shapes),
            "graphs": self.graphs,
            "graphs_after_warmup": self.graphs_after_warmup,
            "recompile_limit_hits": self.tracker.recompile_limit_hits,
            "compile_seconds": self.tracker.compile_seconds,
            "compiling_step_seconds": self.compiling_step_seconds,
            "steady_step_seconds": self.steady_step_seconds,
            "padding_waste": self.padding_waste,
            "real_tokens_per_second": self.real_tokens_per_second,
            "real_tokens_per_second_overall": self.real_tokens_per_second_overall,
            "final_loss": self.losses[-1] if self.losses else None,
            "total_seconds": self.total_seconds,
        }

    def describe(self) -> str:
        """One line: steps, shapes, graphs (after warm-up too), steady step time and final loss."""
        text = (f"{len(self.steps)} step(s) in {len(self.shapes)} shape(s), {self.graphs} graph(s) compiled "
                f"({self.graphs_after_warmup} after warm-up)")
        if self.steady_step_seconds is not None:
            text += f", steady step {self.steady_step_seconds:.3f} s"
        if self.losses:
            text += f", final loss {self.losses[-1]:.3f}"
        return text

    def table(self) -> list[dict]:
        """One dict per step (for printing or plotting)."""
        return [dict(s.__dict__) for s in self.steps]


# Interrupting a run


class StopAtStep(TrainerCallback):
    """Stop training after optimizer step ``step``, as if the machine went away there (to test resuming)."""

    def __init__(self, step: int):
        if step < 1:
            raise ValueError(f"step must be at least 1, got {step}")
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


# The live loss curve


def _figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return buffer.getvalue()


class LiveLossPlot(TrainerCallback):
    """Callback: a loss curve that redraws in place while a notebook trains.
    Redrawn every ``every`` steps as PNG (so it works under nbval; nothing outside IPython), dotted where a step
    compiled; ``reference`` (``{step: loss}``) is drawn dashed behind."""

    def __init__(self, title: str = "training loss", every: int = 1,
                 reference: Mapping[int, float] | None = None, reference_label: str = "reference"):
        self.title, self.every = title, max(1, every)
        self.reference, self.reference_label = dict(reference or {}), reference_label
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.compiled_steps: list[int] = []
        self._handle = None
        self._graphs = 0

    def _display(self):
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return None
        if get_ipython() is None:
            return None
        return display(Image(data=self._render()), display_id=True)

    def _render(self) -> bytes:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 3))
        ax = fig.add_subplot()
        if self.reference:
            ax.plot(list(self.reference), list(self.reference.values()), "--", color="grey",
                    label=self.reference_label)
        draw_loss_curve(ax, self.steps, self.losses, self.compiled_steps, label="this run")
        ax.set_title(f"{self.title} (dotted: a graph was compiled)", fontsize=10)
        if self.reference:
            ax.legend(fontsize=8)
        return _figure_png(fig)

    def on_train_begin(self, args, state, control, **kwargs):
        self._graphs = graphs_compiled()
        self._handle = self._display()

    def on_step_end(self, args, state, control, **kwargs):
        now = graphs_compiled()
        if now > self._graphs:
            self.compiled_steps.append(state.global_step)
        self._graphs = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        self.steps.append(state.global_step)
        self.losses.append(float(logs["loss"]))
        if self._handle is not None and len(self.steps) % self.every == 0:
            from IPython.display import Image

            self._handle.update(Image(data=self._render()))

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            from IPython.display import Image

            self._handle.update(Image(data=self._render()))
