"""trnlab.training's data: the fine-tuning texts, fixed-length padding, packing, bucketing, padding waste."""

from __future__ import annotations

import copy

import pytest
import torch

from trnlab import training
from trnlab.assets.corpus import generate_documents
from trnlab.models import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def texts():
    return training.training_texts(32, seed=0)


def test_training_texts_are_seeded_and_teach_new_laws():
    texts = training.training_texts(50, seed=3)
    assert texts == training.training_texts(50, seed=3)
    assert texts != training.training_texts(50, seed=4)
    # Half state a new law; the other half replay the model's own corpus, so it keeps the old laws.
    assert sum(any(law in t for law in training.NEW_LAWS.values()) for t in texts) == 25
    assert len(set(texts) & set(generate_documents(25, seed=4))) == 25
    assert all(any(law in t for law in training.NEW_LAWS.values()) for t in training.training_texts(20, replay=0))
    # The model's own corpus never states these laws: training on them teaches something new.
    corpus = " ".join(generate_documents(500, seed=0))
    assert training.NEW_FACT_PROMPT in " ".join(texts) and training.NEW_FACT_PROMPT not in corpus
    with pytest.raises(ValueError, match="n=0: give a whole number >= 1"):
        training.training_texts(0)
    with pytest.raises(ValueError, match="replay is a fraction"):
        training.training_texts(10, replay=1.0)


def test_fixed_length_rows_have_one_shape_and_ignore_padding(tokenizer, texts):
    rows = training.fixed_length_dataset(tokenizer, texts, 64)
    assert len(rows) == len(texts)
    assert {tuple(r[k].shape) for r in rows for k in ("input_ids", "attention_mask", "labels")} == {(64,)}
    index = min(range(len(rows)), key=lambda i: int(rows[i]["attention_mask"].sum()))
    row = rows[index]
    n = int(row["attention_mask"].sum())
    assert n < 64, "the shortest text should be padded"
    # Right padding: real tokens first, then padding, whose labels are ignored.
    assert row["attention_mask"][:n].all() and not row["attention_mask"][n:].any()
    assert (row["labels"][n:] == -100).all()
    assert torch.equal(row["labels"][:n], row["input_ids"][:n])
    # pad == eos for this tokenizer: the text's own EOS must stay a label, the padding must not.
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    assert row["input_ids"][n - 1] == tokenizer.eos_token_id and row["labels"][n - 1] == tokenizer.eos_token_id
    assert tokenizer.decode(row["input_ids"][: n - 1]) == texts[index]


def test_fixed_length_truncates_long_texts(tokenizer, texts):
    rows = training.fixed_length_dataset(tokenizer, texts, 8)
    assert all(r["attention_mask"].all() for r in rows)
    assert training.padding_waste(rows) == 0.0


def test_packed_blocks_have_no_padding_and_eos_between_documents(tokenizer, texts):
    rows = training.packed_dataset(tokenizer, texts, 32)
    stream = torch.cat([r["input_ids"] for r in rows])
    expected = []
    for ids in tokenizer(texts)["input_ids"]:
        expected += ids + [tokenizer.eos_token_id]
    assert len(rows) == len(expected) // 32
    assert stream.tolist() == expected[: len(rows) * 32]
    assert training.padding_waste(rows) == 0.0
    for r in rows:
        # Every label is the real token, EOS included: the model learns where documents end
        # and predicts the next document's first token from the EOS.
        assert torch.equal(r["labels"], r["input_ids"]) and r["attention_mask"].all()
    assert sum(int((r["labels"] == tokenizer.eos_token_id).sum()) for r in rows) >= len(texts) - 2


def test_tokenized_rows_keep_their_length(tokenizer, texts):
    rows = training.tokenized_dataset(tokenizer, texts, 512)
    lengths = [len(r["input_ids"]) for r in rows]
    assert len(set(lengths)) > 5
    assert lengths == [len(ids) + 1 for ids in tokenizer(texts)["input_ids"]]
    assert all(r["input_ids"][-1] == tokenizer.eos_token_id for r in rows)


def test_dynamic_padding_makes_many_shapes_buckets_few_fixed_one(tokenizer, texts):
    rows = training.tokenized_dataset(tokenizer, texts, 128)
    pad = tokenizer.pad_token_id
    dynamic = training.batches(rows, training.PaddingCollator(pad), batch_size=4)
    buckets = training.batches(rows, training.PaddingCollator(pad, (48, 96, 128)), batch_size=4)
    fixed = training.batches(training.fixed_length_dataset(tokenizer, texts, 128), training.PaddingCollator(pad, (128,)), 4)
    assert len(training.batch_shapes(dynamic)) > 3
    assert set(training.batch_shapes(buckets)) <= {(4, 48), (4, 96), (4, 128)}
    assert training.batch_shapes(fixed) == [(4, 128)]
    waste = [training.padding_waste(b) for b in (dynamic, buckets, fixed)]
    assert 0 < waste[0] < waste[1] < waste[2] < 1
    # The same real tokens whatever the padding.
    real = [sum(int(b["attention_mask"].sum()) for b in epoch) for epoch in (dynamic, buckets, fixed)]
    assert real[0] == real[1] == real[2]


def test_collator_pads_labels_with_ignore_index(tokenizer):
    rows = training.tokenized_dataset(tokenizer, ["a b c", "a b c d e f g h"], 64)
    batch = training.PaddingCollator(tokenizer.pad_token_id, (16,))(rows)
    n = len(rows[0]["input_ids"])
    assert batch["input_ids"].shape == (2, 16)
    assert (batch["labels"][0, n:] == -100).all()
    assert (batch["input_ids"][0, n:] == tokenizer.pad_token_id).all()
    assert batch["attention_mask"][0].sum() == n


def test_drop_last_keeps_the_batch_dimension(tokenizer, texts):
    rows = training.fixed_length_dataset(tokenizer, texts[:10], 32)
    collator = training.PaddingCollator(tokenizer.pad_token_id, (32,))
    assert training.batch_shapes(training.batches(rows, collator, 4, drop_last=True)) == [(4, 32)]
    assert training.batch_shapes(training.batches(rows, collator, 4, drop_last=False)) == [(4, 32), (2, 32)]


def test_padding_waste_of_one_batch_and_of_rows():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert training.padding_waste({"attention_mask": mask}) == pytest.approx(4 / 8)
    rows = [{"attention_mask": m} for m in mask]
    assert training.padding_waste(rows) == pytest.approx(0.5)


# ---- bad inputs get errors that say what to do


def test_no_pad_token_names_the_token_to_use(tokenizer, texts):
    no_pad = copy.deepcopy(tokenizer)
    no_pad.pad_token = None
    with pytest.raises(ValueError, match=r"no pad token.*tokenizer.pad_token = tokenizer.eos_token.*<\|endoftext\|>"):
        training.fixed_length_dataset(no_pad, texts, 32)


def test_packing_texts_shorter_than_one_block(tokenizer):
    with pytest.raises(ValueError, match=r"at least one full block.*hold \d+ tokens.*length=256.*more texts or a smaller"):
        training.packed_dataset(tokenizer, ["A short text."], 256)


def test_length_beyond_max_position_embeddings(tokenizer, texts):
    with pytest.raises(ValueError, match=r"length=1024 is beyond the model's max_position_embeddings \(512\)"):
        training.packed_dataset(tokenizer, texts, 1024)
    with pytest.raises(ValueError, match=r"length=600 .*max_position_embeddings \(512\).*<= 512"):
        training.fixed_length_dataset(tokenizer, texts, 600)
    with pytest.raises(ValueError, match=r"max_position_embeddings \(64\)"):
        training.tokenized_dataset(tokenizer, texts, 128, max_positions=64)


def test_other_bad_inputs(tokenizer, texts):
    with pytest.raises(TypeError, match="list of strings"):
        training.fixed_length_dataset(tokenizer, "one text", 32)
    with pytest.raises(ValueError, match="texts is empty"):
        training.packed_dataset(tokenizer, [], 32)
    with pytest.raises(ValueError, match="at least 2"):
        training.fixed_length_dataset(tokenizer, texts, 0)
    rows = training.tokenized_dataset(tokenizer, texts, 128)
    with pytest.raises(ValueError, match=r"more than the largest allowed length 8.*length <= 8"):
        training.PaddingCollator(tokenizer.pad_token_id, (8,))(rows[:2])
    with pytest.raises(ValueError, match="attention_mask"):
        training.padding_waste([{"input_ids": torch.ones(3)}])


def test_collator_with_one_length_pads_shorter_rows_and_refuses_longer_ones():
    collator = training.PaddingCollator(0, (4,))
    rows = [{k: torch.tensor(v) for k, v in {"input_ids": [5, 6], "attention_mask": [1, 1],
                                              "labels": [5, 6]}.items()}]
    batch = collator(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 0, 0]] and batch["labels"].tolist() == [[5, 6, -100, -100]]
    too_long = [{k: torch.arange(5) for k in ("input_ids", "attention_mask", "labels")}]
    with pytest.raises(ValueError, match="a row has 5 tokens, more than the largest allowed length 4"):
        collator(too_long)


def test_strategy_dataset_shapes_each_strategy(tokenizer, texts):
    shapes = {}
    for strategy in training.STRATEGIES:
        dataset, collator = training.strategy_dataset(strategy, tokenizer, texts, 128)
        shapes[strategy] = training.batch_shapes(training.batches(dataset, collator, 4))
    assert len(shapes["dynamic"]) > 2
    assert training.default_buckets(128) == (64, 96, 128)
    assert 1 <= len(shapes["buckets"]) <= 3 and {s[1] for s in shapes["buckets"]} <= {64, 96, 128}
    assert shapes["fixed"] == [(4, 128)] and shapes["packed"] == [(4, 128)]
    dataset, collator = training.strategy_dataset("buckets", tokenizer, texts, 128, buckets=[100, 128])
    assert collator.lengths == (100, 128)


def test_strategy_dataset_refuses_empty_or_misplaced_buckets(tokenizer, texts):
    # An empty list used to fall back to the default buckets without a word.
    with pytest.raises(ValueError, match=r"buckets is empty: pass the bucket lengths.*e\.g\. buckets=\(24, 36, 48\)"):
        training.strategy_dataset("buckets", tokenizer, texts, 48, buckets=[])
    with pytest.raises(ValueError, match="buckets is empty"):
        training.strategy_dataset("buckets", tokenizer, texts, 48, buckets=())
    with pytest.raises(ValueError, match=r"largest bucket must be the length rows are truncated to \(48\)"):
        training.strategy_dataset("buckets", tokenizer, texts, 48, buckets=[24, 32])
    with pytest.raises(ValueError, match="buckets only shape the 'buckets' strategy, not 'fixed'"):
        training.strategy_dataset("fixed", tokenizer, texts, 48, buckets=[24, 48])
    with pytest.raises(ValueError, match="unknown strategy 'sorted': use one of dynamic, buckets, fixed, packed"):
        training.strategy_dataset("sorted", tokenizer, texts, 48, buckets=[])


def test_a_registered_strategy_is_built_by_name_and_a_taken_name_is_refused(tokenizer, texts):
    assert list(training.STRATEGIES) == ["dynamic", "buckets", "fixed", "packed"]
    calls = []

    @training.register_strategy("test_truncated")
    def truncated(tokenizer, texts, length, *, pad, buckets, max_positions):
        calls.append((length, pad, buckets, max_positions))
        return training.fixed_length_dataset(tokenizer, texts[:2], length), training.PaddingCollator(pad, (length,))

    try:
        assert training.STRATEGIES["test_truncated"] is truncated and "test_truncated" in training.STRATEGIES
        dataset, collator = training.strategy_dataset("test_truncated", tokenizer, texts, 16, max_positions=64)
        assert calls == [(16, tokenizer.pad_token_id, None, 64)]
        assert len(dataset) == 2 and collator.lengths == (16,)
        with pytest.raises(ValueError, match="buckets only shape the 'buckets' strategy, not 'test_truncated'"):
            training.strategy_dataset("test_truncated", tokenizer, texts, 16, buckets=[16])
        with pytest.raises(ValueError, match=r"'test_truncated' is already registered: pick another name, "
                                             r"pass replace=True, or remove the old entry"):
            training.register_strategy("test_truncated")(lambda *a, **k: None)
        with pytest.raises(ValueError, match="'fixed' is already registered"):
            training.register_strategy("fixed")(lambda *a, **k: None)
        assert training.STRATEGIES["test_truncated"] is truncated
        again = training.register_strategy("test_truncated", replace=True)(lambda *a, **k: None)  # a cell run twice
        assert training.STRATEGIES["test_truncated"] is again and list(training.STRATEGIES)[-1] == "test_truncated"
    finally:
        training.STRATEGIES.pop("test_truncated", None)
    assert list(training.STRATEGIES) == ["dynamic", "buckets", "fixed", "packed"]
    assert ", ".join(training.STRATEGIES) == "dynamic, buckets, fixed, packed"


def test_the_row_length_is_length_everywhere(tokenizer, texts):
    assert len(training.fixed_length_dataset(tokenizer, texts, length=16)[0]["input_ids"]) == 16
    assert max(len(r["input_ids"]) for r in training.tokenized_dataset(tokenizer, texts, length=16)) <= 16
    assert len(training.packed_dataset(tokenizer, texts, length=16)[0]["input_ids"]) == 16
