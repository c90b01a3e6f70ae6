"""Load the course model and tokenizer through ``from_pretrained``, on an explicit device.

``TRNLAB_MODEL`` selects the model everywhere: unset, it is the tiny Qwen3 model shipped in
``trnlab/assets/tiny-qwen3``; on a Trainium instance set it to e.g. ``Qwen/Qwen3-0.6B``.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch

from trnlab.assets.build import BUNDLED_MODEL_DIR
from trnlab.device import pick_device, resolve_device_map, resolve_dtype
from trnlab.settings import MODEL_ENV_VAR, read_settings

#: What a model folder needs, by what reads it: config, weights (any of these), tokenizer.
CONFIG_FILE = "config.json"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
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
            f"`python -m trnlab.assets build` ({exc}).")
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


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id either
        return False


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
        fix = ("rebuild it with `python -m trnlab.assets build`" if is_bundled(name) else
               "copy the whole folder again (e.g. `hf download <model> --local-dir <folder>`), or save "
               "it with save_pretrained()")
        raise ModelNotAvailableError(f"The folder {name!r} is not a complete {what}: it lacks "
                                     f"{', '.join(missing)}. {fix[0].upper() + fix[1:]}.")


def _from_pretrained(loader, name: str, what: str = "model", **kwargs):
    # A folder is checked for the files `what` needs; a hub name is looked up in the local
    # cache first: without network, from_pretrained retries for about a minute before it fails.
    local = Path(name).expanduser().is_dir() or _looks_like_path(name) or is_bundled(name)
    if local:
        _check_folder(name, what)
        name = str(Path(name).expanduser())
    offline = local or _in_hub_cache(name)
    if not offline and not hub_reachable():
        raise _not_available(name, ConnectionError("hub unreachable"))
    try:
        return loader.from_pretrained(name, local_files_only=offline, **kwargs)
    except OSError as exc:
        raise _not_available(name, exc) from exc


def load_config(name: str | os.PathLike | None = None, **kwargs):
    """The Transformers config of model ``name`` (see :func:`model_name`): no weights, offline-aware.

    Used by :func:`trnlab.validate_parallel_sizes` and :func:`trnlab.plan_memory` to check a
    mesh or estimate memory before anything heavy is loaded.
    """
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, model_name(name), "config", **kwargs)


def load_tokenizer(name: str | os.PathLike | None = None, padding_side: str = "left", **kwargs):
    """Load the tokenizer of ``name`` (see :func:`model_name`), left-padding by default.

    Decoder-only models generate after the last prompt token, so batched prompts are padded
    on the left; notebook 02 shows why. Used by every notebook.
    """
    from transformers import AutoTokenizer

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    name = model_name(name)
    tokenizer = _from_pretrained(AutoTokenizer, name, "tokenizer", **kwargs)
    tokenizer.padding_side = padding_side
    return tokenizer


@contextmanager
def _progress_bars(enabled: bool):
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


def load_model(name: str | os.PathLike | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None, progress: bool = False, **kwargs):
    """Load a causal LM with an explicit device map and return it in eval mode.

    ``name`` goes through :func:`model_name` (``TRNLAB_MODEL``, else the bundled model).
    ``device`` goes through :func:`~trnlab.pick_device` (``None``: ``TRNLAB_DEVICE``, else
    "auto", which picks neuron > cuda > cpu; an index such as "neuron:3" is kept) and then
    :func:`~trnlab.resolve_device_map`, so the model never lands on CPU by accident (claim 3).
    ``dtype`` goes through :func:`~trnlab.resolve_dtype` (``None``: ``TRNLAB_DTYPE``, else
    bfloat16 where the device computes it natively, float32 elsewhere). ``progress=True``
    shows the weight-loading bar (off by default: it only clutters notebooks). Extra keyword
    arguments go to ``from_pretrained`` (e.g. ``distributed_config``, ``attn_implementation``).
    """
    from transformers import AutoModelForCausalLM

    name = model_name(name)
    if "device_map" not in kwargs and "distributed_config" not in kwargs:
        device = device if isinstance(device, torch.device) else pick_device(device, verbose=False)
        kwargs["device_map"] = resolve_device_map(str(device) if device.type != "cpu" else "cpu")
        dtype = resolve_dtype(dtype, device)
    else:
        dtype = resolve_dtype(dtype if dtype is not None else "float32")
    with _progress_bars(progress):
        model = _from_pretrained(AutoModelForCausalLM, name, "model", dtype=dtype, **kwargs)
    return model.eval()


def parameter_count(model) -> int:
    """Number of parameters of ``model`` (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
