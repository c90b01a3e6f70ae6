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

#: The device types ``TRNLAB_DEVICE`` names, besides ``auto`` (``trnlab.device.BACKENDS`` agrees).
DEVICE_CHOICES = ("neuron", "cuda", "cpu")


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


def check_device_name(value: str, source: str = "device") -> str:
    """Return ``value`` lower-cased if it names a device the course knows, else raise :class:`SettingError`.

    The forms are ``auto`` or one of :data:`DEVICE_CHOICES` with an optional index
    (``neuron:3``); whether that device exists here is :func:`trnlab.pick_device`'s question.
    """
    name = str(value).strip().lower()
    backend, sep, index = name.partition(":")
    if name == "auto" or (backend in DEVICE_CHOICES and (not sep or index.isdigit())):
        return name
    raise SettingError(f"{source}={value!r} is not a device: use auto, {', '.join(DEVICE_CHOICES)}, "
                       f"or one of those with an index (e.g. neuron:3, cuda:0)")


def check_cpu_threads(value: str, source: str = "cpu_threads") -> int:
    """Return ``value`` as a whole number of threads >= 0, else raise :class:`SettingError`."""
    raw = str(value).strip()
    if not raw.isdigit():
        raise SettingError(f"{source}={value!r}: give a whole number of threads >= 0 "
                           "(0 leaves torch's choice), e.g. 1")
    return int(raw)


#: Each variable with its default and its check, in the order :func:`read_settings` reads them.
_READERS = {
    MODEL_ENV_VAR: (None, lambda value, source: value),
    DEVICE_ENV_VAR: ("auto", check_device_name),
    DTYPE_ENV_VAR: ("auto", check_dtype_name),
    CPU_THREADS_ENV_VAR: ("1", check_cpu_threads),
}


def read_setting(variable: str, environ: dict | None = None):
    """One variable of :func:`read_settings`, checked on its own (a bad one elsewhere does not matter).

    Raises :class:`SettingError` when ``variable`` holds a value the course cannot use.
    Used by ``python -m trnlab doctor``, which reports every bad variable.
    """
    if variable not in _READERS:
        raise KeyError(f"{variable!r} is not a course setting: one of {', '.join(_READERS)}")
    env = os.environ if environ is None else environ
    default, check = _READERS[variable]
    value = env.get(variable) or default
    return None if value is None else check(value, variable)


def setting_problems(environ: dict | None = None) -> dict[str, str]:
    """``{variable: message}`` for every ``TRNLAB_*`` setting that is malformed (empty: all fine)."""
    problems = {}
    for variable in _READERS:
        try:
            read_setting(variable, environ)
        except SettingError as exc:
            problems[variable] = str(exc)
    return problems


def read_settings(environ: dict | None = None) -> Settings:
    """The settings of this process, read from ``environ`` (default ``os.environ``).

    Returns a :class:`Settings`. Raises :class:`SettingError` naming the variable and its valid
    values when one is malformed (``TRNLAB_DEVICE=banana``, ``TRNLAB_DTYPE=float16``,
    ``TRNLAB_CPU_THREADS=two``), so a typo fails at the top of a notebook rather than after a
    model has loaded. Used by :func:`trnlab.setup`, :func:`trnlab.pick_device`,
    :func:`trnlab.load_model` and the CLI.
    """
    return Settings(model=read_setting(MODEL_ENV_VAR, environ), device=read_setting(DEVICE_ENV_VAR, environ),
                    dtype=read_setting(DTYPE_ENV_VAR, environ),
                    cpu_threads=read_setting(CPU_THREADS_ENV_VAR, environ))
