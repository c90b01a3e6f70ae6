"""Load the course model and tokenizer through ``from_pretrained``, on an explicit device.
``TRNLAB_MODEL`` selects the model everywhere: unset, the tiny Qwen3 in ``trnlab/assets/tiny-qwen3``; on Trainium
e.g. ``Qwen/Qwen3-0.6B``."""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from trnlab.assets import BUNDLED_MODEL_DIR
from trnlab.device import pick_device, resolve_device_map, resolve_dtype
from trnlab.instances import PlanError
from trnlab.settings import MODEL_ENV_VAR, progress_bars, read_settings

__all__ = ["CONFIG_FILE", "WEIGHT_PATTERNS", "TOKENIZER_FILES", "ModelNotAvailableError", "model_name",
           "is_bundled", "hub_reachable", "missing_model_files", "model_source", "explained_load_errors",
           "CONFIG_DIR", "SHIPPED_MODELS", "NOT_CONFIG_SUFFIXES", "ConfigError", "text_config",
           "config_from_dict", "shipped_config", "read_config_file", "load_config", "load_tokenizer",
           "is_config", "load_model", "parameter_count"]

#: What a model folder needs, by what reads it: config, weights (any of these), tokenizer.
CONFIG_FILE = "config.json"
#: Weight files a model folder may hold (any of these).
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
#: Tokenizer files a model folder may hold (any of these).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class ModelNotAvailableError(OSError):
    """A model name that is neither a local folder nor reachable on the hub."""


def model_name(name: str | os.PathLike | None = None) -> str:
    """The model to load: ``name``, else ``$TRNLAB_MODEL``, else the bundled tiny Qwen3."""
    chosen = name or read_settings().model or BUNDLED_MODEL_DIR
    return str(chosen)


def is_bundled(name: str | os.PathLike | None = None) -> bool:
    """Whether ``name`` resolves to the course's bundled model."""
    return Path(model_name(name)).resolve() == BUNDLED_MODEL_DIR.resolve()


def _not_available(name: str, exc: Exception) -> ModelNotAvailableError:
    if is_bundled(name):
        return ModelNotAvailableError(
            f"The bundled course model is missing from {BUNDLED_MODEL_DIR}: rebuild it with "
            f"`make model`, which runs python tools/build_model.py ({exc}).")
    return ModelNotAvailableError(
        f"Could not load {name!r}: it is not a local folder and the Hugging Face Hub could not "
        f"be reached or has no such model ({type(exc).__name__}: {exc}). Pre-download it on a machine "
        f"with access (`hf download {name}`), then copy the cache (~/.cache/huggingface, or set "
        f"HF_HOME) or point {MODEL_ENV_VAR} at the downloaded folder; or unset {MODEL_ENV_VAR} "
        f"to use the course's bundled tiny Qwen3 model.")


def hub_reachable(timeout: float = 3.0) -> bool:
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


def _hub_cache_folder(name: str) -> Path | None:
    """The local snapshot folder of hub model ``name`` if its config is in the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(name, CONFIG_FILE)
    except ValueError:  # not a valid repo id either
        return None
    return Path(config).parent if isinstance(config, str) else None


def _looks_like_path(name: str) -> bool:
    # A hub id is "owner/name" or "name"; anything absolute, relative-dotted, home-based or
    # with more than one slash can only be a folder.
    return (Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
            or os.sep in name and os.sep != "/")


def missing_model_files(folder: str | os.PathLike, what: str = "model") -> list[str]:
    """The files a model folder lacks for ``what`` ("config", "model" or "tokenizer"); empty if none."""
    folder = Path(folder)
    missing = []
    if what in ("config", "model") and not (folder / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if what == "model" and not any(next(folder.glob(p), None) for p in WEIGHT_PATTERNS):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if what == "tokenizer" and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    return missing


def _check_folder(name: str, what: str) -> None:
    """Raise :class:`ModelNotAvailableError` naming what a local folder lacks (never "the hub")."""
    path = Path(name).expanduser()
    if not path.exists():
        if is_bundled(name):
            raise _not_available(name, FileNotFoundError(name))
        raise ModelNotAvailableError(
            f"There is no folder at {name!r}. Check the path (it is relative to the current folder, "
            f"{os.getcwd()!r}), or give a hub name such as 'Qwen/Qwen3-0.6B', or unset {MODEL_ENV_VAR} "
            "to use the course's bundled tiny Qwen3 model.")
    if not path.is_dir():
        raise ModelNotAvailableError(f"{name!r} is a file, not a model folder: point at the folder that "
                                     f"holds {CONFIG_FILE} and the weights.")
    missing = missing_model_files(path, what)
    if missing:
        fix = ("rebuild it with `make model` (python tools/build_model.py)" if is_bundled(name) else
               "copy the whole folder again (e.g. `hf download <model> --local-dir <folder>`), or save "
               "it with save_pretrained()")
        raise ModelNotAvailableError(f"The folder {name!r} is not a complete {what}: it lacks "
                                     f"{', '.join(missing)}. {fix[0].upper() + fix[1:]}.")


def model_source(name: str | os.PathLike | None = None, what: str = "model") -> str:
    """Where ``from_pretrained`` should load ``name`` (see :func:`model_name`) from, checked before it runs.
    A folder must hold what ``what`` needs; a cached hub model loads offline; otherwise :class:`ModelNotAvailableError`
    says what to do at once (offline, ``from_pretrained`` would retry for about a minute)."""
    name = model_name(name)
    if Path(name).expanduser().is_dir() or _looks_like_path(name) or is_bundled(name):
        _check_folder(name, what)
        return str(Path(name).expanduser())
    cached = _hub_cache_folder(name)
    if cached is not None and not missing_model_files(cached, what):
        return str(cached)
    if not hub_reachable():
        raise _not_available(name, ConnectionError("hub unreachable"))
    return name


@contextmanager
def explained_load_errors(name: str):
    """Turn an ``OSError`` of ``from_pretrained(name)`` into :class:`ModelNotAvailableError` naming the fix."""
    try:
        yield
    except ModelNotAvailableError:
        raise
    except OSError as exc:
        raise _not_available(name, exc) from exc


# Configs: one lookup for the package (the planner, the mesh check, the launcher, the notebooks)

#: The folder of the Qwen3 configs shipped with the course (published config.json values).
CONFIG_DIR = Path(__file__).resolve().parent / "assets" / "configs"
#: The shipped Qwen3 configs by hub name (``Qwen/Qwen3-8B``): planned offline.
SHIPPED_MODELS: dict[str, Path] = {
    f"Qwen/{size}": CONFIG_DIR / f"{size}.json"
    for size in ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B")
}

#: File endings of weights, tokenizers and other files that sit next to a config.json.
NOT_CONFIG_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx",
                       ".model", ".index.json")


class ConfigError(PlanError):
    """A model config that cannot be read or lacks a needed field; the message names the fix.
    A :class:`trnlab.PlanError`, so the planner's and the mesh check's ``except`` catch it."""


def text_config(config):
    """The language-model part of ``config`` (a multimodal config nests it), else ``config`` itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def is_config(value) -> bool:
    """Whether ``value`` is a Transformers config (it has ``to_dict`` and ``model_type``)."""
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def config_from_dict(values: dict, where: str = "the config dict", required: tuple = (), why: str = ""):
    """A Transformers config from config.json values (a nested ``text_config`` is used if present).
    Raises :class:`ConfigError` naming what is missing: ``model_type`` or any of ``required`` (``why`` is appended)."""
    from transformers import AutoConfig

    if "text_config" in values and isinstance(values["text_config"], dict):
        values = {**values["text_config"], "model_type": values["text_config"].get("model_type",
                                                                                     values.get("model_type"))}
    missing = [f for f in required if values.get(f) is None] + ([] if values.get("model_type") else ["model_type"])
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}{why}")
    kwargs = {k: v for k, v in values.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(values["model_type"], **kwargs)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{where}: model_type {values['model_type']!r} is unknown to this Transformers "
                          f"({exc})") from exc


def shipped_config(name: str | os.PathLike):
    """The shipped Qwen3 config called ``name`` (``"Qwen/Qwen3-8B"`` or ``"Qwen3-8B"``), offline; else None."""
    wanted = str(name).strip().lower()
    for hub_name, path in SHIPPED_MODELS.items():
        if wanted in (hub_name.lower(), hub_name.split("/")[1].lower()):
            config = config_from_dict(json.loads(path.read_text()), str(path))
            config.name_or_path = hub_name
            return config
    return None


def _not_a_config(file: Path, why: str) -> ConfigError:
    folder = file.parent
    where = (f"the folder {folder} holds a config.json: pass --model {folder}" if (folder / CONFIG_FILE).is_file()
             else "pass the model's folder (the one with config.json), or the config.json itself")
    return ConfigError(f"{file} is not a model config ({why}): {where}.")


def read_config_file(file: str | os.PathLike, required: tuple = (), why: str = ""):
    """The config in a config JSON file (see :func:`config_from_dict` for ``required`` and ``why``).
    A weights file, a binary file or JSON that is not an object gets a :class:`ConfigError` naming the folder to pass."""
    file = Path(file)
    name = file.name.lower()
    if name.endswith(NOT_CONFIG_SUFFIXES):
        kind = ".index.json" if name.endswith(".index.json") else file.suffix
        raise _not_a_config(file, f"a {kind} file holds weights or tokenizer data, not the model's sizes")
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _not_a_config(file, "a binary file, not JSON") from None
    except json.JSONDecodeError as exc:
        raise _not_a_config(file, f"not JSON: {exc}") from None
    if not isinstance(values, dict):
        raise _not_a_config(file, f"JSON of a {type(values).__name__}, not a config object")
    return config_from_dict(values, str(file), required, why)


def load_config(name=None, **kwargs):
    """The Transformers config of a model: no weights, offline where it can be.
    ``name``: a config, a model, a dict, a shipped Qwen3 name (:data:`SHIPPED_MODELS`), a folder or hub name (checked by
    :func:`model_source`), or ``None`` (:func:`model_name`); keyword arguments go to ``AutoConfig.from_pretrained``."""
    from transformers import AutoConfig

    if is_config(name):
        return name
    if is_config(getattr(name, "config", None)):
        return name.config
    if isinstance(name, dict):
        return config_from_dict(dict(name))
    shipped = None if kwargs else shipped_config(model_name(name))
    if shipped is not None:
        return shipped
    source = model_source(name, "config")
    with explained_load_errors(source):
        return AutoConfig.from_pretrained(source, **kwargs)


def load_tokenizer(name: str | os.PathLike | None = None, padding_side: str = "left", **kwargs):
    """Load the tokenizer of ``name`` (see :func:`model_name`), left-padding by default.
    Decoder-only models generate after the last prompt token, so batched prompts are padded on the left."""
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

    ``name``, ``device`` and ``dtype`` default to ``TRNLAB_MODEL``, ``TRNLAB_DEVICE`` and ``TRNLAB_DTYPE``;
    ``progress=True`` shows the loading bar; other keyword arguments go to ``from_pretrained``.
    """
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
