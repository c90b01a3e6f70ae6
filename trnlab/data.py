"""Training data with static shapes: fixed-length padding, packing, length buckets.
On Trainium every new input shape compiles a new graph (claims 2 and 9). Rows are dicts of 1-D tensors ``input_ids``,
``attention_mask`` and ``labels`` (``-100`` where the model must not learn); a list of rows is a ``Trainer`` dataset."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from trnlab.assets.corpus import DAYS, NAMES, TOWNS, generate_documents

__all__ = [
    "IGNORE_INDEX", "NEW_FACT_PROMPT", "NEW_LAWS", "NEW_PLACES", "PaddingCollator", "STRATEGIES", "batch_shapes",
    "batches", "check_length", "default_buckets", "fixed_length_dataset", "label_view", "packed_dataset",
    "padding_waste", "real_tokens", "register_strategy", "require_pad_token", "strategy_dataset", "tokenized_dataset",
    "training_texts",
]

#: Label value the loss ignores (``torch.nn.CrossEntropyLoss(ignore_index=-100)``).
IGNORE_INDEX = -100

#: Laws the course model has never seen: fine-tuning on :func:`training_texts` teaches them.
NEW_LAWS = {
    ("Danish", "Butter"): "that butter must be churned from sweet cream and salted with sea salt.",
    ("Irish", "Cider"): "that cider must be pressed from apples grown in the same county.",
}

#: Where each new law's food is made and sold (the same roles as ``trnlab.assets.corpus.PLACES``).
NEW_PLACES = {
    "Butter": ("creamery", "butter maker", "blocks", "churn"),
    "Cider": ("cider house", "cider maker", "casks", "apple press"),
}

#: Prompt whose greedy continuation shows the fine-tuning: before it the model does not know
#: this law, after it the model states it.
NEW_FACT_PROMPT = "The Danish Butter Law states"


def _new_law_document(rng: random.Random) -> str:
    # Same sentence templates as the corpus the model was built on, so only the facts are new.
    country, food = rng.choice(sorted(NEW_LAWS))
    place, maker, units, tool = NEW_PLACES[food]
    town, name, day = rng.choice(TOWNS), rng.choice(NAMES), rng.choice(DAYS)
    law = f"The {country} {food} Law states {NEW_LAWS[(country, food)]}"
    rest = [
        f"In {town}, {name} runs a small {place}.",
        f"Every {day}, the {maker} sells {rng.randint(2, 40)} {units} at the market.",
        f"The {tool} is cleaned before work begins.",
        f"Inspectors visit the {place} to check the {country} {food} Law.",
        f"{name} says the law keeps the {food.lower()} honest.",
        f"Customers in {town} trust the {maker}.",
    ]
    rng.shuffle(rest)
    chosen = rest[: rng.randint(0, 3)]  # 1 to 4 sentences: lengths vary, which dynamic padding shows
    chosen.insert(rng.randint(0, 1), law)
    return " ".join(chosen)


def training_texts(n: int = 256, seed: int = 0, replay: float = 0.5) -> list[str]:
    """The course's fine-tuning dataset: ``n`` seeded documents, most about :data:`NEW_LAWS`.
    Generated, never downloaded; they state two laws the course model has never seen (see :data:`NEW_FACT_PROMPT`), and a
    ``replay`` fraction comes from its own corpus so the old laws are kept."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not 0 <= replay < 1:
        raise ValueError(f"replay is a fraction of the documents, from 0 up to (not including) 1; got {replay}")
    rng = random.Random(seed)
    n_replay = round(n * replay)
    texts = [_new_law_document(rng) for _ in range(n - n_replay)]
    texts += generate_documents(n_replay, seed=seed + 1) if n_replay else []
    rng.shuffle(texts)
    return texts


# Input checks shared by the dataset builders


def require_pad_token(tokenizer) -> int:
    """Return the pad token id, or raise ``ValueError`` saying which token to use instead."""
    if tokenizer.pad_token_id is None:
        hint = (f"set tokenizer.pad_token = tokenizer.eos_token ({tokenizer.eos_token!r}): padding is "
                "masked out by attention_mask and labels, so reusing EOS is safe"
                if tokenizer.eos_token is not None else "add one with tokenizer.add_special_tokens("
                "{'pad_token': '<pad>'}) and resize the model's embeddings")
        raise ValueError(f"This tokenizer has no pad token, which padding needs: {hint}.")
    return tokenizer.pad_token_id


def _max_positions(tokenizer, max_positions: int | None) -> int | None:
    if max_positions is not None:
        return max_positions
    # Tokenizers without a limit report a huge sentinel (int(1e30)); treat that as unknown.
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 1_000_000 else None


def check_length(length: int, max_positions: int | None, what: str = "length") -> int:
    """Return ``length`` if it is a positive int the model's positions cover, else raise ``ValueError``."""
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"{what} must be an int of at least 2 (one token and its next), got {length!r}")
    if max_positions is not None and length > max_positions:
        raise ValueError(
            f"{what}={length} is beyond the model's max_position_embeddings ({max_positions}): positions "
            f"past it have no embedding. Use {what} <= {max_positions}.")
    return length


def _check_texts(texts) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: wrap it as [text]")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: give at least one document (e.g. trnlab.data.training_texts())")
    return texts


def _row(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    # Label every real token, EOS included; padding gets IGNORE_INDEX. Mask by attention_mask,
    # not by token id: this tokenizer's pad token *is* EOS, and EOS is a label the model must learn.
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# Building the rows


def fixed_length_dataset(tokenizer, texts: Sequence[str], length: int, *,
                         max_positions: int | None = None) -> list[dict]:
    """Rows all ``length`` tokens long: ``padding="max_length"``, truncation, EOS after each text.
    One input shape (claim 9); padding on the right with ``-100`` labels. ``max_positions`` defaults to the tokenizer's
    ``model_max_length``: pass ``model.config.max_position_embeddings`` for another model."""
    require_pad_token(tokenizer)  # the tokenizer pads with it
    check_length(length, _max_positions(tokenizer, max_positions))
    texts = _check_texts(texts)
    eos = tokenizer.eos_token or ""
    encoded = tokenizer([t + eos for t in texts], padding="max_length", truncation=True,
                        max_length=length, padding_side="right", return_tensors="pt")
    return [_row(ids, mask) for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])]


def tokenized_dataset(tokenizer, texts: Sequence[str], length: int, *,
                      max_positions: int | None = None) -> list[dict]:
    """Rows of their own length (EOS appended, truncated to ``length`` tokens), no padding yet.
    :class:`PaddingCollator` pads per batch: to the longest row (dynamic padding) or to a bucket length."""
    check_length(length, _max_positions(tokenizer, max_positions))
    texts = _check_texts(texts)
    eos = tokenizer.eos_token or ""
    encoded = tokenizer([t + eos for t in texts], truncation=True, max_length=length)
    rows = []
    for ids in encoded["input_ids"]:
        ids = torch.tensor(ids, dtype=torch.long)
        rows.append(_row(ids, torch.ones_like(ids)))
    return rows


def packed_dataset(tokenizer, texts: Sequence[str], length: int, *,
                   max_positions: int | None = None) -> list[dict]:
    """Documents joined with EOS between them, cut into blocks of ``length`` tokens; no padding.
    ``labels`` equal ``input_ids``; tokens after the last full block are dropped. Raises ``ValueError`` when the texts
    hold fewer tokens than one block."""
    if tokenizer.eos_token_id is None:
        raise ValueError("packing separates documents with EOS, but this tokenizer has no eos_token: "
                         "set tokenizer.eos_token to the model's end-of-text token")
    check_length(length, _max_positions(tokenizer, max_positions))
    texts = _check_texts(texts)
    ids: list[int] = []
    for encoded in tokenizer(texts)["input_ids"]:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    if len(ids) < length:
        raise ValueError(
            f"packing needs at least one full block: the {len(texts)} text(s) hold {len(ids)} tokens "
            f"(EOS included) but the block length is length={length}. Give more texts or a smaller length.")
    usable = len(ids) // length * length
    blocks = torch.tensor(ids[:usable], dtype=torch.long).view(-1, length)
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
            raise ValueError("pad_token_id is None: pass trnlab.data.require_pad_token(tokenizer)")
        if self.lengths is not None:
            lengths = tuple(sorted(set(int(n) for n in self.lengths)))
            if not lengths or lengths[0] < 1:
                raise ValueError(f"lengths must be positive ints, got {self.lengths!r}")
            self.lengths = lengths

    def target_length(self, longest: int) -> int:
        """The length a batch whose longest row has ``longest`` tokens is padded to."""
        if self.lengths is None:
            return longest
        i = bisect.bisect_left(self.lengths, longest)
        if i == len(self.lengths):
            raise ValueError(
                f"a row has {longest} tokens, more than the largest allowed length {self.lengths[-1]}: "
                f"build the dataset with length <= {self.lengths[-1]} so every row fits")
        return self.lengths[i]

    def __call__(self, rows: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("cannot collate an empty batch")
        length = self.target_length(max(len(r["input_ids"]) for r in rows))
        pads = {"input_ids": self.pad_token_id, "attention_mask": 0, "labels": IGNORE_INDEX}
        batch = {key: torch.full((len(rows), length), value, dtype=torch.long) for key, value in pads.items()}
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            for key in pads:
                batch[key][i, :n] = torch.as_tensor(row[key])
        return batch


def batches(dataset: Sequence[Mapping], collator, batch_size: int, drop_last: bool = True,
            seed: int | None = 0) -> list[dict]:
    """The batches a ``DataLoader`` over ``dataset`` yields (shuffled with ``seed``, or in order if None).
    Each distinct shape is one compiled graph on Trainium."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(list(dataset), batch_size=batch_size, shuffle=seed is not None,
                                         drop_last=drop_last, collate_fn=collator, generator=generator)
    return list(loader)


def batch_shapes(batch_list: Iterable[Mapping[str, torch.Tensor]]) -> list[tuple[int, ...]]:
    """Distinct ``input_ids`` shapes in ``batch_list``, in order of first appearance."""
    seen: dict[tuple[int, ...], None] = {}
    for batch in batch_list:
        seen.setdefault(tuple(batch["input_ids"].shape), None)
    return list(seen)


def label_view(tokenizer, row: Mapping[str, torch.Tensor], start: int, stop: int) -> str:
    """Positions ``start:stop`` of a row as lines ``position  token  mask  label``.
    ``-100`` labels are ignored; the model shifts labels itself (position *i* is trained to predict label *i+1*)."""
    stop = min(stop, len(row["input_ids"]))
    lines = [f"{'pos':>4}  {'token':<16} {'mask':>4}  {'label':>6}"]
    for i in range(max(0, start), stop):
        token = repr(tokenizer.decode([int(row["input_ids"][i])]))
        lines.append(f"{i:>4}  {token:<16} {int(row['attention_mask'][i]):>4}  {int(row['labels'][i]):>6}")
    return "\n".join(lines)


def padding_waste(batch_or_dataset) -> float:
    """Fraction of positions that are padding (``attention_mask == 0``), from 0.0 to 1.0.
    Takes one batch (a 1-D or 2-D ``attention_mask``) or a list of batches or rows; measure collated batches."""
    items = [batch_or_dataset] if isinstance(batch_or_dataset, Mapping) else list(batch_or_dataset)
    total = pad = 0
    for item in items:
        if not isinstance(item, Mapping) or "attention_mask" not in item:
            raise ValueError("padding_waste needs dicts with an 'attention_mask' (a batch, or a list of "
                             f"rows or batches); got {type(item).__name__}")
        mask = torch.as_tensor(item["attention_mask"])
        total += mask.numel()
        pad += int((mask == 0).sum())
    if total == 0:
        raise ValueError("padding_waste got no tokens: the batch or dataset is empty")
    return pad / total


def real_tokens(batch_or_dataset) -> int:
    """Number of non-pad positions (``attention_mask == 1``) in a batch or a list of batches/rows."""
    items = [batch_or_dataset] if isinstance(batch_or_dataset, Mapping) else list(batch_or_dataset)
    return sum(int(torch.as_tensor(item["attention_mask"]).sum()) for item in items)


# One entry point for the strategies notebook 04 and the training benchmark compare

#: The ways of shaping a dataset that notebook 04 and ``python -m trnlab bench train`` compare.
#: ``{name: builder}`` in the order they are compared; :func:`register_strategy` fills it.
STRATEGIES: dict[str, Callable[..., tuple[list[dict], PaddingCollator]]] = {}


def register_strategy(name: str, *, replace: bool = False):
    """Decorator: add a builder ``(tokenizer, texts, length, *, pad, buckets, max_positions)`` to :data:`STRATEGIES`.
    ``replace=True`` lets a notebook cell that registers a strategy run again."""
    def register(builder):
        if name in STRATEGIES and not replace:
            raise ValueError(f"a strategy named {name!r} is already registered: pick another name, pass "
                             f"replace=True, or remove the old entry first (del trnlab.data.STRATEGIES[{name!r}])")
        STRATEGIES[name] = builder
        return builder
    return register


def default_buckets(length: int) -> tuple[int, ...]:
    """Three bucket lengths up to ``length``: a half, three quarters and all of it."""
    return tuple(sorted({max(2, length // 2), max(2, 3 * length // 4), length}))


# Each builder gets the checked pad token id and returns (dataset, collator). buckets is None
# for every strategy but "buckets": strategy_dataset refuses buckets= for the others.


@register_strategy("dynamic")
def _dynamic_strategy(tokenizer, texts: Sequence[str], length: int, *, pad: int, buckets: Sequence[int] | None,
                      max_positions: int | None) -> tuple[list[dict], PaddingCollator]:
    """Rows of their own length, each batch padded to its longest row."""
    return tokenized_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad)


@register_strategy("buckets")
def _buckets_strategy(tokenizer, texts: Sequence[str], length: int, *, pad: int, buckets: Sequence[int] | None,
                      max_positions: int | None) -> tuple[list[dict], PaddingCollator]:
    """Rows of their own length, each batch padded to the smallest bucket that fits."""
    if buckets is not None and len(buckets) == 0:
        raise ValueError(
            f"buckets is empty: pass the bucket lengths, in tokens, the largest being length={length} "
            f"(e.g. buckets={default_buckets(length)}), or leave buckets=None for default_buckets(length)")
    lengths = tuple(default_buckets(length) if buckets is None else buckets)
    if max(lengths) != length:
        raise ValueError(f"the largest bucket must be the length rows are truncated to ({length}), got {lengths}")
    return (tokenized_dataset(tokenizer, texts, length, max_positions=max_positions),
            PaddingCollator(pad, lengths))


@register_strategy("fixed")
def _fixed_strategy(tokenizer, texts: Sequence[str], length: int, *, pad: int, buckets: Sequence[int] | None,
                    max_positions: int | None) -> tuple[list[dict], PaddingCollator]:
    """Every row padded (or truncated) to ``length``: the page's ``padding="max_length"``."""
    return (fixed_length_dataset(tokenizer, texts, length, max_positions=max_positions),
            PaddingCollator(pad, (length,)))


@register_strategy("packed")
def _packed_strategy(tokenizer, texts: Sequence[str], length: int, *, pad: int, buckets: Sequence[int] | None,
                     max_positions: int | None) -> tuple[list[dict], PaddingCollator]:
    """Texts joined with EOS and cut into ``length``-token blocks: no padding."""
    return packed_dataset(tokenizer, texts, length, max_positions=max_positions), PaddingCollator(pad, (length,))


def strategy_dataset(strategy: str, tokenizer, texts: Sequence[str], length: int, *,
                     buckets: Sequence[int] | None = None,
                     max_positions: int | None = None) -> tuple[list[dict], PaddingCollator]:
    """``(dataset, collator)`` for one of :data:`STRATEGIES`, every row at most ``length`` tokens.
    ``"dynamic"``, ``"buckets"`` (``None``: :func:`default_buckets`; an empty list raises), ``"fixed"`` or ``"packed"``,
    or a strategy added with :func:`register_strategy`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    pad = require_pad_token(tokenizer)
    if buckets is not None and strategy != "buckets":
        raise ValueError(f"buckets only shape the 'buckets' strategy, not {strategy!r}: drop buckets=, "
                         "or use strategy='buckets'")
    return STRATEGIES[strategy](tokenizer, texts, length, pad=pad, buckets=buckets, max_positions=max_positions)
