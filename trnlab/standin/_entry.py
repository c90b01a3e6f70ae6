"""The ``torch.backends`` entry point: ``import torch`` runs :func:`autoload`, which starts the stand-in if asked.

It imports nothing that imports torch, because torch may be half-imported when it runs: when ``import torch`` is
run by ``trnlab.standin`` itself, the stand-in starts at the end of that module instead (:data:`pending`).
"""

from __future__ import annotations

import os
import sys

from trnlab.settings import NEURON_STANDIN_ENV_VAR

__all__ = ["autoload", "pending"]

#: The variable's value, kept when ``trnlab.standin`` was still being imported: it starts at that import's end.
pending: list[str] = []


def autoload() -> None:
    """Start the STAND-IN neuron device when ``TRNLAB_NEURON_STANDIN=1``; never raises (``import torch`` goes on)."""
    value = os.environ.get(NEURON_STANDIN_ENV_VAR, "").strip()
    if value in ("", "0"):
        return
    standin = sys.modules["trnlab.standin"]  # imported before this, its package
    if hasattr(standin, "start"):
        standin.start(value)
    else:
        pending.append(value)
