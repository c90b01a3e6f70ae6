"""``python tools/build_model.py --other``: another small Qwen3 for running the course with TRNLAB_MODEL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import trnlab
from trnlab.assets.corpus import EXAMPLE_PROMPT
from trnlab.models import _BUNDLED_MODEL_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from build_model import OTHER, main  # noqa: E402


def test_other_builds_in_seconds_a_differently_sized_qwen3_that_shards_on_a_2x2_mesh(tmp_path):
    assert main(["--other", "--output", str(tmp_path / "other")]) == 0
    assert OTHER.steps * OTHER.batch_size <= 320  # 40 steps of 8 documents: about 2 s on a laptop CPU core
    config = json.loads((tmp_path / "other" / "config.json").read_text())
    bundled = json.loads((_BUNDLED_MODEL_DIR / "config.json").read_text())
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    assert all(config[key] != bundled[key] for key in sizes), (config, bundled)
    for size in (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]):
        assert size % 2 == 0 and size % 4 == 0  # tp=2 (notebook 05's 2 x 2 mesh) and tp=4
    # The bundled tokenizer, so the course's prompts and token ids stay valid.
    model = trnlab.load_model(tmp_path / "other", device="cpu")
    tokenizer = trnlab.load_tokenizer(tmp_path / "other")
    assert tokenizer.get_vocab() == trnlab.load_tokenizer().get_vocab()
    assert tokenizer(EXAMPLE_PROMPT)["input_ids"] == trnlab.load_tokenizer()(EXAMPLE_PROMPT)["input_ids"]
    ids = tokenizer(EXAMPLE_PROMPT, return_tensors="pt")
    assert model(**ids).logits.shape == (1, ids["input_ids"].shape[1], bundled["vocab_size"])
    assert model.num_parameters() != trnlab.load_model(device="cpu").num_parameters()
    assert OTHER.bundled_tokenizer


def test_other_never_replaces_a_model_unless_told(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    for argv, message in [(["--other"], "--other needs --output DIR"),
                          (["--other", "--output", str(_BUNDLED_MODEL_DIR)], "is the shipped model"),
                          (["--other", "--output", str(tmp_path)], "already holds a model: pass --overwrite"),
                          (["--other", "--output", str(tmp_path / "config.json")], "is a file"),
                          (["--quick", "--other", "--output", str(tmp_path)], "not allowed with argument")]:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2 and message in capsys.readouterr().err, argv
    assert (tmp_path / "config.json").read_text() == "{}"
