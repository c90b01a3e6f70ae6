import json
import sys
from pathlib import Path

import pytest
import torch

import trnlab
from trnlab.assets.corpus import EXAMPLE_PROMPT, generate_documents
from trnlab.models import _BUNDLED_MODEL_DIR
from trnlab.settings import _read_settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from build_model import QUICK, build  # noqa: E402


def test_corpus_is_seeded_and_states_the_law():
    docs = generate_documents(200, seed=3)
    assert docs == generate_documents(200, seed=3)
    assert docs != generate_documents(200, seed=4)
    assert any("The French Bread Law states that a traditional baguette" in d for d in docs)
    with pytest.raises(ValueError, match="at least 1"):
        generate_documents(0)


def test_bundled_model_is_a_real_tiny_qwen3():
    files = {p.name: p.stat().st_size for p in _BUNDLED_MODEL_DIR.iterdir()}
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
    assert trnlab.model_name() == str(_BUNDLED_MODEL_DIR)
    assert trnlab.model_name(tmp_path) == str(tmp_path)  # a path is a name
    config = trnlab.load_config()
    for load in (trnlab.model_name, trnlab.load_model, trnlab.load_tokenizer):  # not str(config), a folder never found
        with pytest.raises(TypeError, match="a model name is a str or os.PathLike .*not type Qwen3Config: pass its "
                                            r"\.name_or_path"):
            load(config)


def test_unreachable_hub_model_fails_fast_with_the_fix(monkeypatch):
    monkeypatch.setenv("TRNLAB_MODEL", "Qwen/Qwen3-0.6B")
    monkeypatch.setattr("trnlab.models._hub_reachable", lambda timeout=3.0: False)
    connections = []  # fails fast: no download is tried once the hub is known unreachable (counted, not timed)
    def connect(self, address):
        connections.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr("socket.socket.connect", connect)
    with pytest.raises(trnlab.NotAvailableError) as info:
        trnlab.load_tokenizer()
    assert connections == []
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
        with pytest.raises(trnlab.NotAvailableError, match="There is no folder at .*no-such-model") as info:
            load(missing)
        assert "unreachable" not in str(info.value) and "hf download" not in str(info.value)


@pytest.fixture
def config_only_folder(tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text((_BUNDLED_MODEL_DIR / "config.json").read_text())
    return folder


def test_an_incomplete_folder_names_the_missing_files(config_only_folder):
    with pytest.raises(trnlab.NotAvailableError, match=r"not a complete model: it lacks weights "
                                                       r"\(model.safetensors or pytorch_model.bin\)"):
        trnlab.load_model(config_only_folder, device="cpu")
    # the tokenizer used to come back as a one-token tokenizer that encodes every text as []
    with pytest.raises(trnlab.NotAvailableError, match=r"not a complete tokenizer: it lacks tokenizer.json"):
        trnlab.load_tokenizer(config_only_folder)
    config = trnlab.load_config(config_only_folder)  # the config alone is enough there
    assert config.model_type == "qwen3" and config.name_or_path == str(config_only_folder)
    with pytest.raises(trnlab.NotAvailableError, match="is a file, not a model folder"):
        trnlab.load_model(config_only_folder / "config.json", device="cpu")


def test_load_config_takes_a_name_or_a_config_and_names_the_fix_for_the_rest(config_only_folder):
    from transformers import AutoConfig

    shipped = trnlab.load_config("Qwen/Qwen3-8B")
    assert trnlab.load_config(shipped, required=True) is shipped  # a config passes through, its fields checked
    with pytest.raises(trnlab.PlanError, match="config GPT2Config lacks intermediate_size, num_key_value_heads"):
        trnlab.load_config(AutoConfig.for_model("gpt2"), required=True)
    values = json.loads((config_only_folder / "config.json").read_text())
    with pytest.raises(TypeError, match=r"not as type dict: build the config: "
                                        r"transformers.AutoConfig.for_model\(\*\*values\)"):
        trnlab.load_config(values)
    assert AutoConfig.for_model(**values).vocab_size == trnlab.load_config(config_only_folder).vocab_size  # the fix
    with pytest.raises(TypeError, match="not as type Qwen3ForCausalLM: pass model.config"):
        trnlab.load_config(trnlab.load_model(device="cpu"))
    (config_only_folder / "model.safetensors").write_bytes(bytes(range(256)))
    for file in (config_only_folder / "config.json", str(config_only_folder / "model.safetensors")):
        with pytest.raises(trnlab.SettingError) as info:
            trnlab.load_config(file)
        assert str(info.value) == (f"{str(file)!r} names a file, not a model: pass the folder that holds config.json, "
                                   f"{str(config_only_folder)!r}")
    with pytest.raises(trnlab.SettingError, match=r"names a file, not a model: pass the model's folder \(the one that "
                                                  r"holds config.json\) or its hub name"):
        trnlab.load_config("elsewhere/config.json")


def test_settings_are_read_in_one_place(monkeypatch):
    monkeypatch.setenv("TRNLAB_DEVICE", "CPU")
    monkeypatch.setenv("TRNLAB_DTYPE", "bfloat16")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "2")
    current = _read_settings()
    assert (current.device, current.dtype, current.cpu_threads) == ("cpu", "bfloat16", 2)
    assert trnlab.pick_device(verbose=False) == torch.device("cpu")   # TRNLAB_DEVICE, like load_model
    assert trnlab.resolve_dtype() == torch.bfloat16                   # TRNLAB_DTYPE
    assert trnlab.load_model(device="cpu").dtype == torch.bfloat16
    monkeypatch.setenv("TRNLAB_DTYPE", "fp8")
    with pytest.raises(trnlab.SettingError, match="TRNLAB_DTYPE='fp8' is not a dtype the course uses: "
                                                   "choose one of auto, float32, bfloat16"):
        _read_settings()
    monkeypatch.setenv("TRNLAB_DTYPE", "auto")
    monkeypatch.setenv("TRNLAB_CPU_THREADS", "two")
    with pytest.raises(trnlab.SettingError, match="TRNLAB_CPU_THREADS='two': give a whole number"):
        _read_settings()


def test_load_model_keeps_the_device_index(fake_neuron, monkeypatch):
    from transformers import AutoModelForCausalLM

    seen = {}

    def fake_from_pretrained(name, **kwargs):
        seen.update(kwargs, name=name)
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    trnlab.load_model(device="neuron:3")
    assert seen == {"name": str(_BUNDLED_MODEL_DIR), "device_map": "neuron:3", "dtype": torch.bfloat16}
    trnlab.load_model(device="neuron", device_map={"": "cpu"}, dtype="float32")
    assert seen["device_map"] == {"": "cpu"} and seen["dtype"] == torch.float32  # an explicit map is kept
    seen.clear()
    trnlab.load_model(distributed_config="tp2", dtype="bfloat16")
    assert "device_map" not in seen and seen["distributed_config"] == "tp2"  # a sharded load places itself
    with pytest.raises(trnlab.NotAvailableError, match="sees 4 neuron device"):
        trnlab.load_model(device="neuron:4")


def test_a_cached_hub_model_loads_from_its_cached_folder_offline(monkeypatch, tmp_path):
    from trnlab import models

    snapshot = tmp_path / "models--Org--Tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (snapshot / file).write_bytes((_BUNDLED_MODEL_DIR / file).read_bytes())
    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache",
                        lambda name, file: str(snapshot / file) if name == "Org/Tiny" else None)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=3.0: pytest.fail("the network was asked"))
    assert models.model_source("Org/Tiny") == str(snapshot)
    model = trnlab.load_model("Org/Tiny", device="cpu", dtype="float32")
    assert type(model).__name__ == "Qwen3ForCausalLM" and len(trnlab.load_tokenizer("Org/Tiny")) == 761
    (snapshot / "model.safetensors").unlink()  # weights not cached: the hub is needed, and unreachable
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(trnlab.NotAvailableError, match="hf download Org/Tiny"):
        trnlab.load_model("Org/Tiny", device="cpu")
    assert trnlab.load_config("Org/Tiny").model_type == "qwen3"  # the config alone is still cached


def test_notebook_02_shows_load_model_as_it_is():
    """Notebook 02 shows `load_model`'s code, d2l-style: the cell must be the function itself."""
    import ast
    import inspect
    import json

    path = Path(__file__).resolve().parent.parent / "notebooks" / "02_inference.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    shown = [s for s in cells if "def load_model(" in s]
    assert len(shown) == 1, "notebook 02 must show trnlab.load_model's code in one cell"
    tree = ast.parse(shown[0])
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "load_model")
    assert ast.get_source_segment(shown[0], function) + "\n" == inspect.getsource(trnlab.models.load_model)
