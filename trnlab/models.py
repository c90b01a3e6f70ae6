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
from trnlab.device import bf16_supported, pick_device, resolve_device_map

MODEL_ENV_VAR = "TRNLAB_MODEL"


class ModelNotAvailableError(OSError):
    """A model name that is neither a local folder nor reachable on the hub."""


def model_name(name: str | os.PathLike | None = None) -> str:
    """The model to load: ``name``, else ``$TRNLAB_MODEL``, else the bundled tiny Qwen3."""
    chosen = name or os.environ.get(MODEL_ENV_VAR) or BUNDLED_MODEL_DIR
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


def _from_pretrained(loader, name: str, **kwargs):
    # Without network, from_pretrained retries for about a minute before it fails: look first.
    offline = Path(name).is_dir() or _in_hub_cache(name)
    if not offline and not hub_reachable():
        raise _not_available(name, ConnectionError("hub unreachable"))
    try:
        return loader.from_pretrained(name, local_files_only=offline, **kwargs)
    except OSError as exc:
        raise _not_available(name, exc) from exc


def load_tokenizer(name: str | os.PathLike | None = None, padding_side: str = "left", **kwargs):
    """Load the tokenizer of ``name`` (see :func:`model_name`), left-padding by default.

    Decoder-only models generate after the last prompt token, so batched prompts are padded
    on the left; notebook 02 shows why. Used by every notebook.
    """
    from transformers import AutoTokenizer

    name = model_name(name)
    tokenizer = _from_pretrained(AutoTokenizer, name, **kwargs)
    tokenizer.padding_side = padding_side
    return tokenizer


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the device computes it natively (Neuron, recent GPUs), else float32."""
    return torch.bfloat16 if bf16_supported(device.type) else torch.float32


@contextmanager
def _progress_bars(enabled: bool):
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


def load_model(name: str | os.PathLike | None = None, device: str | torch.device = "auto",
               dtype: torch.dtype | str | None = None, progress: bool = False, **kwargs):
    """Load a causal LM with an explicit device map and return it in eval mode.

    ``device`` goes through :func:`~trnlab.device.pick_device` ("auto" picks neuron > cuda >
    cpu) and then :func:`~trnlab.device.resolve_device_map`, so the model never lands on CPU
    by accident. ``dtype=None`` picks :func:`default_dtype`. ``progress=True`` shows the
    weight-loading bar (off by default: it only clutters notebooks). Extra keyword arguments go to
    ``from_pretrained`` (e.g. ``distributed_config``).
    """
    from transformers import AutoModelForCausalLM

    name = model_name(name)
    if "device_map" not in kwargs and "distributed_config" not in kwargs:
        device = device if isinstance(device, torch.device) else pick_device(device, verbose=False)
        kwargs["device_map"] = resolve_device_map(device.type if device.type != "cuda" else str(device))
        dtype = dtype or default_dtype(device)
    with _progress_bars(progress):
        model = _from_pretrained(AutoModelForCausalLM, name, dtype=dtype or torch.float32, **kwargs)
    return model.eval()


def parameter_count(model) -> int:
    """Number of parameters of ``model`` (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
