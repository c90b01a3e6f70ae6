"""Load the course model, its tokenizer and its config through ``from_pretrained``, on an explicit device.
``TRNLAB_MODEL`` selects the model everywhere: unset, the tiny Qwen3 in ``trnlab/assets/tiny-qwen3``."""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from trnlab.device import pick_device, resolve_device_map, resolve_dtype
from trnlab.settings import _MODEL_ENV_VAR, NotAvailableError, PlanError, SettingError, _read_settings, progress_bars

__all__ = ["SHIPPED_MODELS", "model_name", "model_source", "explained_load_errors", "load_config", "load_tokenizer",
           "load_model", "parameter_count"]

_ASSETS = Path(__file__).resolve().parent / "assets"
#: Where the shipped model lives inside the package (``python tools/build_model.py`` rebuilds it).
_BUNDLED_MODEL_DIR = _ASSETS / "tiny-qwen3"
#: The shipped Qwen3 configs by hub name (``Qwen/Qwen3-8B``), published config.json values: planned offline.
SHIPPED_MODELS: dict[str, Path] = {f"Qwen/{size}": _ASSETS / "configs" / f"{size}.json" for size in
                                   ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B")}

_CONFIG_FILE = "config.json"
#: Weight and tokenizer files a model folder may hold (any of each).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
#: Fields the planner reads from a config (``load_config(required=True)``).
_REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size")


def model_name(name: str | os.PathLike | None = None) -> str:
    """The model to load: ``name``, else ``$TRNLAB_MODEL``, else the bundled tiny Qwen3."""
    if name is not None and not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"a model name is a str or os.PathLike (a hub name, a shipped name or a folder), not type "
                        f"{type(name).__name__}" + ": pass its .name_or_path" * hasattr(name, "name_or_path"))
    return str(name or _read_settings().model or _BUNDLED_MODEL_DIR)


def _is_bundled(name: str | os.PathLike | None = None) -> bool:
    """Whether ``name`` resolves to the course's bundled model."""
    return Path(model_name(name)).resolve() == _BUNDLED_MODEL_DIR.resolve()


def _not_available(name: str, exc: Exception) -> NotAvailableError:
    if _is_bundled(name):
        return NotAvailableError(f"The bundled course model is missing from {_BUNDLED_MODEL_DIR}: rebuild it with "
                                 f"`make model`, which runs python tools/build_model.py ({exc}).")
    return NotAvailableError(
        f"Could not load {name!r}: it is not a local folder and the Hugging Face Hub could not "
        f"be reached or has no such model ({type(exc).__name__}: {exc}). Pre-download it on a machine "
        f"with access (`hf download {name}`), then copy the cache (~/.cache/huggingface, or set "
        f"HF_HOME) or point {_MODEL_ENV_VAR} at the downloaded folder; or unset {_MODEL_ENV_VAR} "
        f"to use the course's bundled tiny Qwen3 model.")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub endpoint answers a TCP connection within ``timeout`` s."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _missing_model_files(folder: str | os.PathLike, what: str = "model") -> list[str]:
    """The files a model folder lacks for ``what`` ("config", "model" or "tokenizer"); empty if none."""
    folder = Path(folder)
    missing = []
    if what in ("config", "model") and not (folder / _CONFIG_FILE).is_file():
        missing.append(_CONFIG_FILE)
    if what == "model" and not any(next(folder.glob(p), None) for p in _WEIGHT_PATTERNS):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if what == "tokenizer" and not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        missing.append(" or ".join(_TOKENIZER_FILES))
    return missing


def model_source(name: str | os.PathLike | None = None, what: str = "model") -> str:
    """Where ``from_pretrained`` should load ``name`` from, checked first: a folder holding what ``what`` needs, a
    cached hub model (offline), else a NotAvailableError at once (``from_pretrained`` would retry for a minute)."""
    from huggingface_hub import try_to_load_from_cache

    name = model_name(name)
    path = Path(name).expanduser()
    # A hub id is "owner/name" or "name"; anything absolute, dotted, home-based or with more slashes is a folder.
    if (path.is_dir() or Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
            or os.sep in name and os.sep != "/" or _is_bundled(name)):
        if not path.exists() and _is_bundled(name):
            raise _not_available(name, FileNotFoundError(name))
        if not path.exists():
            raise NotAvailableError(
                f"There is no folder at {name!r}. Check the path (it is relative to the current folder, "
                f"{os.getcwd()!r}), or give a hub name such as 'Qwen/Qwen3-0.6B', or unset {_MODEL_ENV_VAR} "
                "to use the course's bundled tiny Qwen3 model.")
        if not path.is_dir():
            raise NotAvailableError(f"{name!r} is a file, not a model folder: point at the folder that "
                                    f"holds {_CONFIG_FILE} and the weights.")
        missing = _missing_model_files(path, what)
        if missing:
            fix = ("Rebuild it with `make model` (python tools/build_model.py)" if _is_bundled(name) else
                   "Copy the whole folder again (e.g. `hf download <model> --local-dir <folder>`), or save "
                   "it with save_pretrained()")
            raise NotAvailableError(f"The folder {name!r} is not a complete {what}: it lacks {', '.join(missing)}. "
                                    f"{fix}.")
        return str(path)
    try:
        cached = try_to_load_from_cache(name, _CONFIG_FILE)
    except ValueError:  # not a valid repo id either
        cached = None
    if isinstance(cached, str) and not _missing_model_files(Path(cached).parent, what):
        return str(Path(cached).parent)
    if not _hub_reachable():
        raise _not_available(name, ConnectionError("hub unreachable"))
    return name


@contextmanager
def explained_load_errors(name: str):
    """Turn an ``OSError`` of ``from_pretrained(name)`` into :class:`trnlab.NotAvailableError` naming the fix."""
    try:
        yield
    except NotAvailableError:
        raise
    except OSError as exc:
        raise _not_available(name, exc) from exc


def _lacks(where: str, missing: list, required: bool) -> None:
    if missing:
        raise PlanError(f"{where} lacks {', '.join(missing)}" + required * (
            f": the planner needs {', '.join(_REQUIRED_FIELDS + ('model_type',))} (head_dim defaults to "
            "hidden_size / num_attention_heads)."))


def _from_values(values: dict, where: str, required: bool):
    """A config from config.json values (or their ``text_config``); a PlanError names a missing field."""
    from transformers import AutoConfig

    if isinstance(values.get("text_config"), dict):
        values = {**values["text_config"], "model_type": values["text_config"].get("model_type",
                                                                                     values.get("model_type"))}
    _lacks(where, [f for f in _REQUIRED_FIELDS if required and values.get(f) is None]
           + ([] if values.get("model_type") else ["model_type"]), required)
    try:
        return AutoConfig.for_model(values["model_type"], **{k: v for k, v in values.items() if k != "model_type"})
    except (ValueError, KeyError) as exc:
        raise PlanError(f"{where}: model_type {values['model_type']!r} is unknown to this Transformers "
                        f"({exc})") from exc


def _read_json(file: Path, required: bool):
    """The config in a config.json; one that is not a JSON object is a PlanError naming the fix."""
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
        why_not = None if isinstance(values, dict) else f"JSON of a {type(values).__name__}, not a config object"
    except UnicodeDecodeError:
        why_not = "a binary file, not JSON"
    except json.JSONDecodeError as exc:
        why_not = f"not JSON: {exc}"
    if why_not is None:
        return _from_values(values, str(file), required)
    raise PlanError(f"{file} is not a model config ({why_not}): copy the model's config.json into {file.parent} "
                    "again (e.g. `hf download <model> config.json --local-dir <folder>`).")


def _checked_name(name):
    """``name`` if it names a model (a str or os.PathLike that is not a file, or None), else an error naming the fix."""
    if name is None or isinstance(name, (str, os.PathLike)):
        path = Path(name).expanduser() if name is not None else None
        if path is not None and (path.is_file() or path.name.lower().endswith(".json")):
            held = (path.parent / _CONFIG_FILE).is_file()
            fix = (f"the folder that holds {_CONFIG_FILE}, {str(path.parent)!r}" if held else
                   f"the model's folder (the one that holds {_CONFIG_FILE}) or its hub name")
            raise SettingError(f"{str(name)!r} names a file, not a model: pass {fix}")
        return name
    from transformers import PreTrainedConfig

    if isinstance(name, dict):
        fix = "build the config: transformers.AutoConfig.for_model(**values) (the values hold its model_type)"
    elif isinstance(getattr(name, "config", None), PreTrainedConfig):
        fix = "pass model.config"
    else:
        fix = "pass the model's name, or a config built with transformers.AutoConfig.for_model(model_type, ...)"
    raise TypeError(f"a model is named (a hub name, a shipped Qwen3 such as 'Qwen/Qwen3-8B', a folder holding "
                    f"{_CONFIG_FILE}, or None for {_MODEL_ENV_VAR}) or given as its Transformers config, not as "
                    f"type {type(name).__name__}: {fix}")


def load_config(name=None, *, required: bool = False):
    """The Transformers config of a model, no weights, offline where it can be; ``config.name_or_path`` names it.
    ``name``: a hub name, a shipped Qwen3, a folder holding config.json or ``None``; a Transformers config passes
    through. ``required=True``: a :class:`trnlab.PlanError` names each field the planner reads that it lacks."""
    from transformers import AutoConfig, PreTrainedConfig

    if isinstance(name, PreTrainedConfig):
        config, where = name, f"config {type(name).__name__}"
    else:
        name = model_name(_checked_name(name))
        shipped = next((hub for hub in SHIPPED_MODELS if name.strip().lower() in (hub.lower(),
                                                                                 hub.split("/")[1].lower())), None)
        folder = Path(name).expanduser()
        if shipped or (folder / _CONFIG_FILE).is_file():
            config = _read_json(SHIPPED_MODELS[shipped] if shipped else folder / _CONFIG_FILE, required)
        else:
            source = model_source(name, "config")
            with explained_load_errors(source):
                config = AutoConfig.from_pretrained(source)
        config.name_or_path, where = shipped or str(folder), f"config of {name!r}"
    _lacks(where, [f for f in _REQUIRED_FIELDS if required and getattr(config.get_text_config(), f, None) is None],
           required)
    return config


def load_tokenizer(name: str | os.PathLike | None = None, padding_side: str = "left", **kwargs):
    """The tokenizer of ``name``, padding on the left: decoders generate after the last token."""
    from transformers import AutoTokenizer

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    source = model_source(name, "tokenizer")
    with explained_load_errors(source):
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    tokenizer.padding_side = padding_side
    return tokenizer


def load_model(name=None, device=None, dtype=None, progress=False, **kwargs):
    """Load a causal LM the page's way: ``from_pretrained`` with an explicit device map and dtype, in eval mode.
    ``name``/``device``/``dtype`` default to ``TRNLAB_MODEL``/``TRNLAB_DEVICE``/``TRNLAB_DTYPE``; ``progress=True``
    shows the loading bar; other keyword arguments go to ``from_pretrained``."""
    from transformers import AutoModelForCausalLM

    source = model_source(name)                   # TRNLAB_MODEL, else the bundled model; checked first
    device = pick_device(device, verbose=False)   # TRNLAB_DEVICE, else neuron > cuda > cpu
    if "distributed_config" not in kwargs:        # a sharded load places the model itself
        kwargs.setdefault("device_map", resolve_device_map(str(device)))  # never "auto": it misses Neuron
    dtype = resolve_dtype(dtype, device)          # TRNLAB_DTYPE, else bfloat16 where native
    with progress_bars(progress), explained_load_errors(source):
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    return model.eval()


def parameter_count(model) -> int:
    """Number of parameters of ``model`` (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
