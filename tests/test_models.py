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


def test_a_folder_that_does_not_exist_is_never_called_the_hub(tmp_path):
    missing = str(tmp_path / "no-such-model")
    for load in (trnlab.load_model, trnlab.load_tokenizer, trnlab.load_config):
        with pytest.raises(trnlab.ModelNotAvailableError, match="There is no folder at .*no-such-model") as info:
            load(missing)
        assert "unreachable" not in str(info.value) and "hf download" not in str(info.value)


@pytest.fixture
def config_only_folder(tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((BUNDLED_MODEL_DIR / "config.json").read_text())
    return folder


def test_an_incomplete_folder_names_the_missing_files(config_only_folder):
    with pytest.raises(trnlab.ModelNotAvailableError, match=r"not a complete model: it lacks weights "
                                                            r"\(model.safetensors or pytorch_model.bin\)"):
        trnlab.load_model(config_only_folder, device="cpu")
    # the tokenizer used to come back as a one-token tokenizer that encodes every text as []
    with pytest.raises(trnlab.ModelNotAvailableError, match=r"not a complete tokenizer: it lacks tokenizer.json"):
        trnlab.load_tokenizer(config_only_folder)
    assert trnlab.load_config(config_only_folder).model_type == "qwen3"  # the config alone is enough there
    with pytest.raises(trnlab.ModelNotAvailableError, match="is a file, not a model folder"):
        trnlab.load_config(config_only_folder / "config.json")


def test_settings_are_read_in_one_place(monkeypatch):
    monkeypatch.setenv("TRNLAB_DEVICE", "CPU")
    monkeypatch.setenv("TRNLAB_DTYPE", "bfloat16")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "2")
    current = trnlab.read_settings()
    assert (current.device, current.dtype, current.cpu_threads) == ("cpu", "bfloat16", 2)
    assert trnlab.pick_device(verbose=False) == torch.device("cpu")   # TRNLAB_DEVICE, like load_model
    assert trnlab.resolve_dtype() == torch.bfloat16                   # TRNLAB_DTYPE
    assert trnlab.load_model(device="cpu").dtype == torch.bfloat16
    monkeypatch.setenv("TRNLAB_DTYPE", "fp8")
    with pytest.raises(trnlab.SettingError, match="TRNLAB_DTYPE='fp8' is not a dtype the course uses: "
                                                   "choose one of auto, float32, bfloat16"):
        trnlab.read_settings()
    monkeypatch.setenv("TRNLAB_DTYPE", "auto")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "two")
    with pytest.raises(trnlab.SettingError, match="TRNLAB_CPU_THREADS='two': give a whole number"):
        trnlab.read_settings()


def test_load_model_keeps_the_device_index(fake_neuron, monkeypatch):
    seen = {}

    def fake_from_pretrained(loader, name, what="model", **kwargs):
        seen.update(kwargs)
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr("trnlab.models._from_pretrained", fake_from_pretrained)
    trnlab.load_model(device="neuron:3")
    assert seen["device_map"] == "neuron:3" and seen["dtype"] == torch.bfloat16
