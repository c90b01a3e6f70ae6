"""Training with static shapes (notebook 04): the fine-tuning texts, datasets, collators, ``Trainer`` callbacks, the
``bf16`` choice, the checkpoint to resume from. On Trainium each new input shape compiles a new graph (claims 2, 7-9).
A row is a dict of 1-D ``input_ids``, ``attention_mask`` and ``labels`` (``-100``: not learned); a dataset, a list."""

from __future__ import annotations

import bisect
import contextlib
import io
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from trnlab import _compat
from trnlab.assets.corpus import _document, generate_documents
from trnlab.compile_tracking import CompileTracker, _steady_median
from trnlab.device import _bf16_supported
from trnlab.generation import compile_backend as pick_compile_backend
from trnlab.settings import _environment, quiet_transformers, whole_number

__all__ = [
    "NEW_FACT_PROMPT", "NEW_LAWS", "STRATEGIES", "LiveLossPlot", "PaddingCollator", "StopAtStep", "TrainingRecorder",
    "batch_shapes", "batches", "compile_settings", "default_buckets", "fixed_length_dataset", "label_view",
    "last_checkpoint", "packed_dataset", "padding_waste", "precision_choice", "register_strategy", "strategy_dataset",
    "tokenized_dataset", "training_texts",
]

#: Laws the course model has never seen: fine-tuning on :func:`training_texts` teaches them.
NEW_LAWS = {
    ("Danish", "Butter"): "that butter must be churned from sweet cream and salted with sea salt.",
    ("Irish", "Cider"): "that cider must be pressed from apples grown in the same county.",
}

#: Prompt whose greedy continuation shows the fine-tuning: the model states this law only after it.
NEW_FACT_PROMPT = "The Danish Butter Law states"

_IGNORE_INDEX = -100  # the label value the loss ignores (torch.nn.CrossEntropyLoss(ignore_index=-100))


def training_texts(n: int = 256, seed: int = 0, replay: float = 0.5) -> list[str]:
    """The course's fine-tuning dataset: ``n`` seeded documents, most stating one of :data:`NEW_LAWS`.
    Generated, never downloaded; a ``replay`` fraction comes from the model's own corpus so it keeps the old laws."""
    whole_number("n", n)
    if not 0 <= replay < 1:
        raise ValueError(f"replay is a fraction of the documents, from 0 up to (not including) 1; got {replay}")
    rng = random.Random(seed)
    n_replay = round(n * replay)
    # The corpus's sentences, so only the facts are new; 1 to 4 of them: lengths vary, which dynamic padding shows.
    texts = [_document(rng, NEW_LAWS, others=(0, 3)) for _ in range(n - n_replay)]
    texts += generate_documents(n_replay, seed=seed + 1) if n_replay else []
    rng.shuffle(texts)
    return texts


# Datasets
def _require_pad_token(tokenizer) -> int:
    if tokenizer.pad_token_id is None:
        hint = (f"set tokenizer.pad_token = tokenizer.eos_token ({tokenizer.eos_token!r}): padding is "
                "masked out by attention_mask and labels, so reusing EOS is safe"
                if tokenizer.eos_token is not None else "add one with tokenizer.add_special_tokens("
                "{'pad_token': '<pad>'}) and resize the model's embeddings")
        raise ValueError(f"This tokenizer has no pad token, which padding needs: {hint}.")
    return tokenizer.pad_token_id


def _checked_texts(tokenizer, texts, length, max_positions: int | None) -> list[str]:
    # `texts` as a list, once `length` is known to fit the model's positions (default: the tokenizer's limit).
    limit = getattr(tokenizer, "model_max_length", None)  # a huge sentinel (int(1e30)) when there is none
    if max_positions is None and isinstance(limit, int) and limit < 1_000_000:
        max_positions = limit
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"length must be an int of at least 2 (one token and its next), got {length!r}")
    if max_positions is not None and length > max_positions:
        raise ValueError(
            f"length={length} is beyond the model's max_position_embeddings ({max_positions}): positions "
            f"past it have no embedding. Use length <= {max_positions}.")
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: wrap it as [text]")
    if not (texts := list(texts)):
        raise ValueError("texts is empty: give at least one document (e.g. trnlab.training_texts())")
    return texts


def _row(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    # Label every real token, EOS included; padding gets -100. Mask by attention_mask, not by token id:
    # this tokenizer's pad token *is* EOS, and EOS is a label the model must learn.
    labels = input_ids.masked_fill(attention_mask == 0, _IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def fixed_length_dataset(tokenizer, texts: Sequence[str], length: int, *,
                         max_positions: int | None = None) -> list[dict]:
    """Rows all ``length`` tokens long, one input shape (claim 9): ``padding="max_length"`` on the right, truncated.
    An EOS ends each text; ``max_positions`` defaults to the tokenizer's limit (else give the model config's)."""
    _require_pad_token(tokenizer)  # the tokenizer pads with it
    texts = _checked_texts(tokenizer, texts, length, max_positions)
    encoded = tokenizer([t + (tokenizer.eos_token or "") for t in texts], padding="max_length", truncation=True,
                        max_length=length, padding_side="right", return_tensors="pt")
    return [_row(ids, mask) for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]


def tokenized_dataset(tokenizer, texts: Sequence[str], length: int, *, max_positions: int | None = None) -> list[dict]:
    """Rows of their own length (EOS appended, truncated to ``length`` tokens), no padding yet.
    :class:`PaddingCollator` pads per batch: to the longest row (dynamic padding) or to a bucket length."""
    texts = _checked_texts(tokenizer, texts, length, max_positions)
    encoded = tokenizer([t + (tokenizer.eos_token or "") for t in texts], truncation=True, max_length=length)
    rows = [torch.tensor(ids, dtype=torch.long) for ids in encoded["input_ids"]]
    return [_row(ids, torch.ones_like(ids)) for ids in rows]


def packed_dataset(tokenizer, texts: Sequence[str], length: int, *, max_positions: int | None = None) -> list[dict]:
    """Documents joined with EOS between them, cut into blocks of ``length`` tokens: no padding, labels = input ids.
    Tokens after the last full block are dropped; ``ValueError`` when the texts hold less than one block."""
    if tokenizer.eos_token_id is None:
        raise ValueError("packing separates documents with EOS, but this tokenizer has no eos_token: "
                         "set tokenizer.eos_token to the model's end-of-text token")
    texts = _checked_texts(tokenizer, texts, length, max_positions)
    ids = [i for encoded in tokenizer(texts)["input_ids"] for i in (*encoded, tokenizer.eos_token_id)]
    if len(ids) < length:
        raise ValueError(
            f"packing needs at least one full block: the {len(texts)} text(s) hold {len(ids)} tokens "
            f"(EOS included) but the block length is length={length}. Give more texts or a smaller length.")
    blocks = torch.tensor(ids[:len(ids) // length * length], dtype=torch.long).view(-1, length)
    return [_row(block, torch.ones_like(block)) for block in blocks]


# Batching
@dataclass
class PaddingCollator:
    """Stack rows into a batch, padding them on the right to a length chosen per batch.
    ``lengths=None`` pads to the batch's longest row (dynamic padding: a new shape most batches); ``lengths=(64, 128)``
    pads to the smallest that fits (bucketing). A row longer than every length raises ``ValueError``."""

    pad_token_id: int
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.pad_token_id is None:
            raise ValueError("pad_token_id is None: set tokenizer.pad_token = tokenizer.eos_token (padding is masked "
                             "out), then pass tokenizer.pad_token_id")
        if self.lengths is not None:
            lengths = tuple(sorted(set(int(n) for n in self.lengths)))
            if not lengths or lengths[0] < 1:
                raise ValueError(f"lengths must be positive ints, got {self.lengths!r}")
            self.lengths = lengths

    def __call__(self, rows: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("cannot collate an empty batch")
        length = longest = max(len(r["input_ids"]) for r in rows)
        if self.lengths is not None:
            if longest > self.lengths[-1]:
                raise ValueError(
                    f"a row has {longest} tokens, more than the largest allowed length {self.lengths[-1]}: "
                    f"build the dataset with length <= {self.lengths[-1]} so every row fits")
            length = self.lengths[bisect.bisect_left(self.lengths, longest)]
        pads = {"input_ids": self.pad_token_id, "attention_mask": 0, "labels": _IGNORE_INDEX}
        batch = {key: torch.full((len(rows), length), value, dtype=torch.long) for key, value in pads.items()}
        for i, row in enumerate(rows):
            for key in pads:
                batch[key][i, :len(row["input_ids"])] = torch.as_tensor(row[key])
        return batch


def batches(dataset: Sequence[Mapping], collator, batch_size: int, drop_last: bool = True,
            seed: int | None = 0) -> list[dict]:
    """The batches a ``DataLoader`` over ``dataset`` yields (shuffled with ``seed``, or in order if None).
    Each distinct shape is one compiled graph on Trainium."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return list(torch.utils.data.DataLoader(list(dataset), batch_size=batch_size, shuffle=seed is not None,
                                            drop_last=drop_last, collate_fn=collator, generator=generator))


def batch_shapes(batch_list: Iterable[Mapping[str, torch.Tensor]]) -> list[tuple[int, ...]]:
    """Distinct ``input_ids`` shapes in ``batch_list``, in order of first appearance."""
    return list(dict.fromkeys(tuple(batch["input_ids"].shape) for batch in batch_list))


def label_view(tokenizer, row: Mapping[str, torch.Tensor], start: int, stop: int) -> str:
    """Positions ``start:stop`` of a row as lines ``position  token  mask  label``.
    ``-100`` labels are ignored; the model shifts labels itself (position *i* is trained to predict label *i+1*)."""
    lines = [f"{'pos':>4}  {'token':<16} {'mask':>4}  {'label':>6}"]
    for i in range(max(0, start), min(stop, len(row["input_ids"]))):
        token = repr(tokenizer.decode([int(row["input_ids"][i])]))
        lines.append(f"{i:>4}  {token:<16} {int(row['attention_mask'][i]):>4}  {int(row['labels'][i]):>6}")
    return "\n".join(lines)


def padding_waste(batch_or_dataset) -> float:
    """Fraction of positions that are padding (``attention_mask == 0``), from 0.0 to 1.0.
    Takes one batch (a 1-D or 2-D ``attention_mask``) or a list of batches or rows; measure collated batches."""
    items = [batch_or_dataset] if isinstance(batch_or_dataset, Mapping) else list(batch_or_dataset)
    for item in items:
        if not isinstance(item, Mapping) or "attention_mask" not in item:
            raise ValueError("padding_waste needs dicts with an 'attention_mask' (a batch, or a list of "
                             f"rows or batches); got {type(item).__name__}")
    masks = [torch.as_tensor(item["attention_mask"]) for item in items]
    if not (total := sum(mask.numel() for mask in masks)):
        raise ValueError("padding_waste got no tokens: the batch or dataset is empty")
    return sum(int((mask == 0).sum()) for mask in masks) / total


# The strategies notebook 04 and `python -m trnlab bench train` compare
#: The ways of shaping a dataset, ``{name: builder}`` in the order compared; :func:`register_strategy` fills it.
STRATEGIES: dict[str, Callable[..., tuple[list[dict], PaddingCollator]]] = {}


def register_strategy(name: str, *, replace: bool = False):
    """Decorator: add a builder ``(tokenizer, texts, length, *, pad, buckets, max_positions)`` to :data:`STRATEGIES`.
    It returns ``(dataset, collator)``; ``replace=True`` lets a notebook cell that registers a strategy run again."""
    def register(builder):
        if name in STRATEGIES and not replace:
            raise ValueError(f"a strategy named {name!r} is already registered: pick another name, pass "
                             f"replace=True, or remove the old entry first (del trnlab.training.STRATEGIES[{name!r}])")
        STRATEGIES[name] = builder
        return builder
    return register


def default_buckets(length: int) -> tuple[int, ...]:
    """Three bucket lengths up to ``length``: a half, three quarters and all of it."""
    return tuple(sorted({max(2, length // 2), max(2, 3 * length // 4), length}))


# Each builder gets the checked pad token id; buckets is None for every strategy but "buckets".
@register_strategy("dynamic")
def _dynamic_strategy(tokenizer, texts, length, *, pad, buckets, max_positions):
    """Rows of their own length, each batch padded to its longest row."""
    return tokenized_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad)


@register_strategy("buckets")
def _buckets_strategy(tokenizer, texts, length, *, pad, buckets, max_positions):
    """Rows of their own length, each batch padded to the smallest bucket that fits."""
    if buckets is not None and len(buckets) == 0:
        raise ValueError(
            f"buckets is empty: pass the bucket lengths, in tokens, the largest being length={length} "
            f"(e.g. buckets={default_buckets(length)}), or leave buckets=None for default_buckets(length)")
    lengths = tuple(default_buckets(length) if buckets is None else buckets)
    if max(lengths) != length:
        raise ValueError(f"the largest bucket must be the length rows are truncated to ({length}), got {lengths}")
    return tokenized_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad, lengths)


@register_strategy("fixed")
def _fixed_strategy(tokenizer, texts, length, *, pad, buckets, max_positions):
    """Every row padded (or truncated) to ``length``: the page's ``padding="max_length"``."""
    return fixed_length_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad, (length,))


@register_strategy("packed")
def _packed_strategy(tokenizer, texts, length, *, pad, buckets, max_positions):
    """Texts joined with EOS and cut into ``length``-token blocks: no padding."""
    return packed_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad, (length,))


def strategy_dataset(strategy: str, tokenizer, texts, length: int, *, buckets: Sequence[int] | None = None,
                     max_positions: int | None = None) -> tuple[list[dict], PaddingCollator]:
    """``(dataset, collator)`` for one of :data:`STRATEGIES`, every row at most ``length`` tokens.
    ``"dynamic"``, ``"buckets"`` (``None``: :func:`default_buckets`; an empty list raises), ``"fixed"`` or ``"packed"``,
    or a strategy added with :func:`register_strategy`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    pad = _require_pad_token(tokenizer)
    if buckets is not None and strategy != "buckets":
        raise ValueError(f"buckets only shape the 'buckets' strategy, not {strategy!r}: drop buckets=, "
                         "or use strategy='buckets'")
    return STRATEGIES[strategy](tokenizer, texts, length, pad=pad, buckets=buckets, max_positions=max_positions)


# TrainingArguments and Trainer
def precision_choice(device: torch.device | str, weights=None) -> tuple[bool, str]:
    """``(bf16, reason)``: whether to pass ``bf16=True`` on ``device``, and why, for ``weights`` (a model or its dtype).
    ``bf16`` is Accelerate's mixed precision: it does not cast the weights, so the run trains in their loaded dtype."""
    backend = torch.device(device).type
    dtype = getattr(weights, "dtype", weights)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"weights must be the loaded model or its torch dtype (e.g. model.dtype), got {weights!r}")
    name = str(dtype).removeprefix("torch.")
    if _bf16_supported(backend):
        why = ("every Trainium generation computes in bfloat16 natively" if backend == "neuron"
               else f"this {backend} device supports bfloat16 natively")
        held = "" if dtype is None else f"; the {name} weights stay {name} (bf16=True is mixed precision)"
        return True, f"bf16=True: {why}{held}."
    why = ("bf16=False: trnlab passes bf16=True only where the device computes bfloat16 natively, not on a CPU"
           if backend == "cpu" else f"bf16=False: this {backend} device has no native bfloat16")
    trains = ("the dtype the weights were loaded in (pass the model to name it)" if dtype is None
              else f"{name}, the dtype the weights were loaded in")
    elsewhere = "; on Trainium the same call picks bf16=True" if backend == "cpu" else ""
    return False, f"{why}, so this run trains in {trains}{elsewhere}."


def _page_arguments(output_dir: str | os.PathLike, device: torch.device | str, *, max_steps: int,
                    batch_size: int = 8, learning_rate: float = 1e-3, compile_backend: str | None = None,
                    seed: int = 0, **overrides) -> TrainingArguments:
    """The page's ``TrainingArguments(output_dir=..., bf16=..., torch_compile=True, dataloader_drop_last=True, ...)``,
    with ``bf16`` from :func:`precision_choice`, a constant rate and the loss logged each step; ``overrides`` last."""
    device, max_steps = torch.device(device), whole_number("max_steps", max_steps)
    # Checked against the device; None (Transformers' pick) for "neuron" on Neuron, as the page teaches (claim 8).
    backend = None if compile_backend is None else pick_compile_backend(device, compile_backend)
    kwargs = dict(
        output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        bf16=precision_choice(device)[0], use_cpu=device.type == "cpu", torch_compile=True,
        torch_compile_backend=None if device.type == "neuron" and backend == "neuron" else backend,
        dataloader_drop_last=True, dataloader_num_workers=0, seed=seed, data_seed=seed, logging_steps=1,
        report_to="none", save_strategy="no", include_num_input_tokens_seen="non_padding",
        disable_tqdm=logging.get_verbosity() > logging.WARNING,  # Transformers' default, which quiet_transformers flips
    )
    with quiet_transformers():  # no "speedups for torchdynamo mostly come with GPU Ampere" on CPU or Trainium
        return TrainingArguments(**{**kwargs, **overrides})


@contextlib.contextmanager
def _static_shape_compiles():
    """A ``Trainer`` built inside compiles with ``dynamic=False`` on any device, as on Neuron: elsewhere dynamo would
    make a changing length symbolic, hiding the recompiles Trainium does (sets ``ACCELERATE_DYNAMO_USE_DYNAMIC``)."""
    with _environment(**{_compat.ACCELERATE_DYNAMIC_ENV_VAR: "false"}):
        yield


def compile_settings(trainer: Trainer) -> dict:
    """The keyword arguments the Trainer will give ``torch.compile`` (empty if it does not compile)."""
    plugin = _compat.trainer_dynamo_plugin(trainer)
    if str(plugin.backend.value).lower() == "no":
        return {}
    return {"backend": plugin.backend.value.lower(), "mode": plugin.mode, "dynamic": plugin.dynamic}


def last_checkpoint(output_dir: str | os.PathLike) -> str:
    """The newest ``checkpoint-N`` folder in ``output_dir``, for ``train(resume_from_checkpoint=...)``.
    Raises ``FileNotFoundError`` saying how to get checkpoints when there is none."""
    found = get_last_checkpoint(str(output_dir)) if os.path.isdir(output_dir) else None
    if found is None:
        raise FileNotFoundError(
            f"no checkpoint-N folder in {output_dir}: train with save_steps set "
            '(TrainingArguments(..., save_strategy="steps", save_steps=N)) so there is one to resume from')
    return found


# Callbacks
@dataclass
class _StepRecord:
    """One optimizer step: loss, wall seconds, batch shape, tokens (real and all), graphs compiled."""

    step: int
    loss: float | None
    seconds: float
    shape: tuple[int, ...] | None
    real_tokens: int | None
    tokens: int | None
    new_graphs: int
    graphs_so_far: int


@dataclass
class TrainingRecorder(TrainerCallback):
    """Callback: per step, the loss, step time, batch shape and graphs compiled so far.
    Warm-up is the first ``warmup_steps`` optimizer steps; :attr:`graphs_after_warmup` is 0 for a static-shape run.
    Pass the collator as ``data_collator=recorder.watch(collator)`` so each step knows its batch shape."""

    warmup_steps: int = 1
    steps: list[_StepRecord] = field(default_factory=list)
    tracker: CompileTracker = field(default_factory=CompileTracker)
    _batches: list = field(default_factory=list, repr=False)
    _started: tuple = (0.0, 0)  # (perf_counter, graphs) at the start of the step

    def watch(self, collator):
        """``collator``, wrapped so this recorder sees the shape and real tokens of every batch it builds."""
        if getattr(collator, "recorder", None) is self:
            return collator

        def watched(rows):
            batch = collator(rows)
            ids, mask = batch["input_ids"], batch.get("attention_mask")
            self._batches.append((tuple(ids.shape), ids.numel() if mask is None else int(mask.sum()), ids.numel()))
            return batch
        watched.recorder = self
        return watched

    def on_train_begin(self, args, state, control, **kwargs):
        self.steps.clear()
        self._batches.clear()
        self.tracker.__enter__()

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = (time.perf_counter(), self.tracker.graphs)

    def on_step_end(self, args, state, control, **kwargs):
        seconds, graphs = time.perf_counter() - self._started[0], self.tracker.graphs
        # Optimizer step i trains on micro-batches i*G .. (i+1)*G - 1 (G: gradient accumulation steps). Matched by
        # position, not by "batches seen so far": the data loader may have collated the next step's first batch already.
        per_step = max(1, args.gradient_accumulation_steps)
        i = len(self.steps)
        mine = self._batches[i * per_step:(i + 1) * per_step]
        shape = max((b[0] for b in mine), default=None)  # the longest, if the micro-batches differ
        real, tokens = (sum(b[1] for b in mine), sum(b[2] for b in mine)) if mine else (None, None)
        self.steps.append(_StepRecord(state.global_step, None, seconds, shape, real, tokens,
                                      graphs - self._started[1], graphs))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self.steps and self.steps[-1].step == state.global_step:
            self.steps[-1].loss = float(logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self.tracker.__exit__(None, None, None)

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

    def summary(self) -> dict:
        """The figures of notebook 04's tables and of the benchmark report, as a dict (``None``: nothing to measure).
        Steady steps come after warm-up and compiled nothing; tokens per second count real (non-pad) tokens."""
        steady = [s for s in self.steps[self.warmup_steps:] if s.new_graphs == 0]
        counted = [s for s in self.steps if s.tokens]

        def per_second(steps):  # real tokens per wall second
            seconds = sum(s.seconds for s in steps)
            return sum(s.real_tokens for s in steps) / seconds if steps and seconds > 0 else None
        return {
            "steps": len(self.steps), "shapes": len(self.shapes),
            "graphs": self.graphs, "graphs_after_warmup": self.graphs_after_warmup,
            "recompile_limit_hits": self.tracker.recompile_limit_hits, "compile_seconds": self.tracker.compile_seconds,
            # with what compile_seconds leaves out: the first backward and optimizer step, a lazy backward
            "compiling_step_seconds": sum(s.seconds for s in self.steps if s.new_graphs),
            "steady_step_seconds": _steady_median(s.seconds for s in steady),
            "padding_waste": (1 - sum(s.real_tokens for s in counted) / sum(s.tokens for s in counted)
                              if counted else None),
            "real_tokens_per_second": per_second([s for s in steady if s.tokens]),
            "real_tokens_per_second_overall": per_second(counted),
            "final_loss": self.losses[-1] if self.losses else None,
            "total_seconds": sum(s.seconds for s in self.steps),
        }


class StopAtStep(TrainerCallback):
    """Stop training after optimizer step ``step``, as if the machine went away there (to test resuming)."""

    def __init__(self, step: int):
        self.step = whole_number("step", step)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


class LiveLossPlot(TrainerCallback):
    """Callback: a loss curve that redraws in place while a notebook trains, every ``every`` steps.
    A PNG (so it works under nbval; nothing outside IPython), dotted where a step compiled; ``reference``, dashed."""

    def __init__(self, title: str = "training loss", every: int = 1,
                 reference: Mapping[int, float] | None = None, reference_label: str = "reference"):
        self.title, self.every = title, max(1, every)
        self.reference, self.reference_label = dict(reference or {}), reference_label
        self.steps, self.losses, self.compiled_steps = [], [], []  # steps, their losses, the steps that compiled
        self._handle, self._graphs = None, 0

    def _render(self) -> bytes:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 3))
        ax = fig.add_subplot()
        if self.reference:
            ax.plot(list(self.reference), list(self.reference.values()), "--", color="grey",
                    label=self.reference_label)
        line, = ax.plot(self.steps, self.losses, marker=".", label="this run")
        for step in self.compiled_steps:  # dotted: a step that compiled a graph
            ax.axvline(step, color=line.get_color(), linestyle=":", alpha=0.5)
        ax.set(xlabel="optimizer step", ylabel="training loss")
        ax.set_title(f"{self.title} (dotted: a graph was compiled)", fontsize=10)
        if self.reference:
            ax.legend(fontsize=8)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        return buffer.getvalue()

    def _show(self, new: bool = False):
        # new=True: display the curve as a new output, inside IPython only; else redraw the one displayed.
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return
        if new and get_ipython() is not None:
            self._handle = display(Image(data=self._render()), display_id=True)
        elif self._handle is not None:
            self._handle.update(Image(data=self._render()))

    def on_train_begin(self, args, state, control, **kwargs):
        self._graphs, self._handle = _compat.dynamo_unique_graphs(), None
        self._show(new=True)

    def on_step_end(self, args, state, control, **kwargs):
        if (now := _compat.dynamo_unique_graphs()) > self._graphs:
            self.compiled_steps.append(state.global_step)
        self._graphs = now

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append(state.global_step)
            self.losses.append(float(logs["loss"]))
            if len(self.steps) % self.every == 0:
                self._show()

    def on_train_end(self, args, state, control, **kwargs):
        self._show()
