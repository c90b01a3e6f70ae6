import time
from pathlib import Path

import pytest
import torch

import trnlab
from trnlab.assets import BUNDLED_MODEL_DIR, EXAMPLE_PROMPT, generate_documents
from trnlab.assets.build import QUICK, build


def test_corpus_is_seeded_and_states_the_law():
    docs = generate_documents(200, seed=3)
    assert docs == generate_documents(200, seed=3)
    assert docs != generate_documents(200, seed=4)
    assert any("The French Bread Law states that a traditional baguette" in d for d in docs)
    with pytest.raises(ValueError, match="at least 1"):
        generate_documents(0)


def test_bundled_model_is_a_real_tiny_qwen3():
    files = {p.name: p.stat().st_size for p in BUNDLED_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert sum(files.values()) <= 10 * 2**20
    model = trnlab.load_model(device="cpu")
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert 1_000_000 <= trnlab.parameter_count(model) <= 5_000_000
    assert model.device.type == "cpu" and model.dtype == torch.float32 and not model.training
    tokenizer = trnlab.load_tokenizer()
    assert type(tokenizer).__name__ == "Qwen2Tokenizer" and tokenizer.is_fast
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<|endoftext|>"


def test_bundled_model_continues_the_page_example():
    model, tokenizer = trnlab.load_model(device="cpu"), trnlab.load_tokenizer()
    inputs = tokenizer(EXAMPLE_PROMPT, return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    assert text.startswith(EXAMPLE_PROMPT + " that a traditional baguette may contain only flour, water, salt and yeast.")


def test_trnlab_model_env_selects_the_model(monkeypatch, tmp_path):
    monkeypatch.setenv("TRNLAB_MODEL", str(tmp_path / "elsewhere"))
    assert trnlab.model_name() == str(tmp_path / "elsewhere")
    assert trnlab.model_name("explicit") == "explicit"
    monkeypatch.delenv("TRNLAB_MODEL")
    assert trnlab.model_name() == str(BUNDLED_MODEL_DIR)


def test_unreachable_hub_model_fails_fast_with_the_fix(monkeypatch):
    monkeypatch.setenv("TRNLAB_MODEL", "Qwen/Qwen3-0.6B")
    monkeypatch.setattr("trnlab.models.hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(trnlab.ModelNotAvailableError) as info:
        trnlab.load_tokenizer()
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "hf download Qwen/Qwen3-0.6B" in message and "unset TRNLAB_MODEL" in message


def test_quick_build_makes_a_loadable_model(tmp_path):
    out = build(tmp_path / "tiny", QUICK, log=lambda *_: None)
    model = trnlab.load_model(out, device="cpu")
    tokenizer = trnlab.load_tokenizer(out)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    ids = tokenizer(EXAMPLE_PROMPT, return_tensors="pt")
    assert model(**ids).logits.shape == (1, ids["input_ids"].shape[1], len(tokenizer))
    assert Path(out, "model.safetensors").exists()
