"""The ``torch.backends`` entry point: ``import torch`` runs :func:`autoload`, which starts the stand-in if asked.
Outside :mod:`trnlab.standin`, so that ``import torch`` loads the stand-in only when ``TRNLAB_NEURON_STANDIN`` is set;
when ``trnlab.standin`` itself runs ``import torch``, it starts at that module's end instead (:data:`_pending`)."""

from __future__ import annotations

import importlib
import os
import sys

from trnlab.settings import _NEURON_STANDIN_ENV_VAR

__all__ = ["autoload"]

#: The variable's value, kept when ``trnlab.standin`` was still being imported: it starts at that import's end.
_pending: list[str] = []


def autoload() -> None:
    """Start the STAND-IN neuron device when ``TRNLAB_NEURON_STANDIN=1``; never raises (``import torch`` goes on).
    Unset or ``0``: nothing; any other value, a blank one too, warns through :func:`trnlab.standin.start`."""
    value = os.environ.get(_NEURON_STANDIN_ENV_VAR)
    if value is None or value.strip() == "0":
        return
    value = value.strip() or value
    standin = sys.modules.get("trnlab.standin")
    if standin is not None and not hasattr(standin, "start"):  # trnlab.standin is importing torch: it starts itself
        _pending.append(value)
        return
    importlib.import_module("trnlab.standin").start(value)
