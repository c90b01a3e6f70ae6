"""The one setup call at the top of every notebook."""

from __future__ import annotations

import random

import torch

from trnlab.device import package_versions, pick_device


def setup(device: str = "auto", seed: int = 0) -> torch.device:
    """Seed every generator, print versions and the device, and return that device.

    Called once in the first cells of every notebook, after the parameter cell.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    versions = package_versions()
    print(", ".join(f"{name} {version}" for name, version in versions.items() if version))
    chosen = pick_device(device)
    print(f"device: {chosen}")
    return chosen
