"""The one setup call at the top of every notebook."""

from __future__ import annotations

import random

import torch

from trnlab.device import package_versions, pick_device
from trnlab.settings import read_settings


def setup(device: str | None = None, seed: int = 0, cpu_threads: int | None = None) -> torch.device:
    """Seed every generator, print versions and the device, and return that device.

    ``device=None`` reads ``TRNLAB_DEVICE`` (see :func:`trnlab.read_settings`). On CPU it
    sets torch's thread count to ``cpu_threads`` (``None``: ``TRNLAB_CPU_THREADS``, default
    1; 0 keeps torch's choice): on a shared 2-core machine one thread trains the tiny model
    several times faster than two. Called once in every notebook, after the parameter cell.
    """
    current = read_settings()
    random.seed(seed)
    torch.manual_seed(seed)
    versions = package_versions()
    print(", ".join(f"{name} {version}" for name, version in versions.items() if version))
    chosen = pick_device(device if device is not None else current.device)
    threads = current.cpu_threads if cpu_threads is None else cpu_threads
    if chosen.type == "cpu" and threads:
        torch.set_num_threads(threads)
    print(f"device: {chosen}")
    return chosen
