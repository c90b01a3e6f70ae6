"""The course's settings, read from the environment in one place.

Every notebook's parameter cell, the Python API and the command line read the same
variables through :func:`read_settings`, so a default never differs between them:

=========================  ================  ===========================================
variable                   default           meaning
=========================  ================  ===========================================
``TRNLAB_MODEL``           bundled model     a hub name (``Qwen/Qwen3-0.6B``) or a folder
``TRNLAB_DEVICE``          ``auto``          ``auto`` (neuron > cuda > cpu), ``neuron``,
                                             ``cuda``, ``cpu``, or with an index (``neuron:3``)
``TRNLAB_DTYPE``           ``auto``          ``auto`` (bfloat16 where native), ``float32``,
                                             ``bfloat16``
``TRNLAB_CPU_THREADS``     ``1``             torch threads on CPU (one is steadier on a
                                             shared 2-core machine); ``0``: torch's choice
=========================  ================  ===========================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MODEL_ENV_VAR = "TRNLAB_MODEL"
DEVICE_ENV_VAR = "TRNLAB_DEVICE"
DTYPE_ENV_VAR = "TRNLAB_DTYPE"
CPU_THREADS_ENV_VAR = "TRNLAB_CPU_THREADS"

#: The values ``TRNLAB_DTYPE`` (and every ``dtype=`` argument given as a string) accepts.
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


class SettingError(ValueError):
    """A ``TRNLAB_*`` variable holds a value the course cannot use; the message names the fix."""


@dataclass(frozen=True)
class Settings:
    """The course's settings: model, device, dtype and CPU threads (see the module docstring)."""

    model: str | None        # None: the bundled tiny Qwen3
    device: str              # "auto", "neuron", "cuda", "cpu" or with an index
    dtype: str               # "auto", "float32" or "bfloat16"
    cpu_threads: int         # 0: leave torch's choice

    def as_dict(self) -> dict:
        return {"model": self.model, "device": self.device, "dtype": self.dtype, "cpu_threads": self.cpu_threads}


def check_dtype_name(value: str, source: str = "dtype") -> str:
    """Return ``value`` lower-cased if it is one of :data:`DTYPE_CHOICES`, else raise :class:`SettingError`."""
    name = str(value).strip().lower().removeprefix("torch.")
    if name not in DTYPE_CHOICES:
        raise SettingError(f"{source}={value!r} is not a dtype the course uses: choose one of "
                           f"{', '.join(DTYPE_CHOICES)}")
    return name


def read_settings(environ: dict | None = None) -> Settings:
    """The settings of this process, read from ``environ`` (default ``os.environ``).

    Returns a :class:`Settings`. Raises :class:`SettingError` when a variable is malformed, so
    a typo fails at the top of a notebook rather than after a model has loaded. Used by
    :func:`trnlab.setup`, :func:`trnlab.pick_device`, :func:`trnlab.load_model` and the CLI.
    """
    env = os.environ if environ is None else environ
    model = env.get(MODEL_ENV_VAR) or None
    device = (env.get(DEVICE_ENV_VAR) or "auto").strip().lower()
    dtype = check_dtype_name(env.get(DTYPE_ENV_VAR) or "auto", DTYPE_ENV_VAR)
    raw_threads = (env.get(CPU_THREADS_ENV_VAR) or "1").strip()
    if not raw_threads.isdigit():
        raise SettingError(f"{CPU_THREADS_ENV_VAR}={raw_threads!r}: give a whole number of threads "
                           "(0 leaves torch's choice)")
    return Settings(model=model, device=device, dtype=dtype, cpu_threads=int(raw_threads))
