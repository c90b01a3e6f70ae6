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

A notebook's own knobs (``TRNLAB_MAX_NEW_TOKENS``, ``TRNLAB_LENGTH``...) are read in its
parameter cell with :func:`knob`, which converts them and names the variable on a bad value.
Course defaults that are not variables live here too (:data:`DEFAULT_INSTANCE`), and so do the
ways the package changes its process's settings for the length of a block:
:func:`environment` (environment variables), :func:`progress_bars` (Transformers' progress
bars, on or off) and :func:`quiet_transformers` (Transformers' logging, and its bars through
:func:`progress_bars`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = [
    "CPU_THREADS_ENV_VAR", "DEFAULT_INSTANCE", "DEVICE_CHOICES", "DEVICE_ENV_VAR", "DTYPE_CHOICES", "DTYPE_ENV_VAR",
    "MODEL_ENV_VAR", "NEURON_STANDIN_ENV_VAR", "LaunchError", "NotAvailableError", "PlanError", "SettingError",
    "Settings", "TrnlabError", "whole_number", "check_cpu_threads", "check_device_name",
    "check_dtype_name",
    "environment", "knob", "progress_bars", "quiet_transformers", "read_setting", "read_settings",
    "setting_problems",
]

#: The model to use: a hub name or a folder (unset: the bundled tiny Qwen3).
MODEL_ENV_VAR = "TRNLAB_MODEL"
#: The device: ``auto``, ``neuron``, ``cuda``, ``cpu``, or one with an index.
DEVICE_ENV_VAR = "TRNLAB_DEVICE"
#: The dtype: ``auto``, ``float32`` or ``bfloat16``.
DTYPE_ENV_VAR = "TRNLAB_DTYPE"
#: Torch threads on CPU (``0``: torch's choice).
CPU_THREADS_ENV_VAR = "TRNLAB_CPU_THREADS"
#: ``1`` starts the STAND-IN neuron device (:mod:`trnlab.standin`) when torch is imported.
NEURON_STANDIN_ENV_VAR = "TRNLAB_NEURON_STANDIN"

#: The values ``TRNLAB_DTYPE`` (and every ``dtype=`` argument given as a string) accepts.
DTYPE_CHOICES = ("auto", "float32", "bfloat16")

#: The device types ``TRNLAB_DEVICE`` names, besides ``auto`` (``trnlab.device.BACKENDS`` is this tuple).
DEVICE_CHOICES = ("neuron", "cuda", "cpu")

#: The instance a real run is planned and launched for when none is named (notebook 06).
DEFAULT_INSTANCE = "trn2.48xlarge"


class TrnlabError(Exception):
    """The base of every error trnlab raises: ``except trnlab.TrnlabError`` catches them all."""


class SettingError(TrnlabError, ValueError):
    """A setting or an argument holds a value trnlab cannot use; the message names the fix."""


class PlanError(SettingError):
    """A mesh, an instance or a model config that cannot be planned or launched; the message names the fix."""


class NotAvailableError(TrnlabError, RuntimeError, OSError):
    """A device, a model or a tool this machine does not have; the message says how to get it."""


class LaunchError(TrnlabError, RuntimeError):
    """A launched run failed, timed out or left processes behind; the message names the rank and the fix."""


def whole_number(name: str, value, minimum: int = 1) -> int:
    """``value`` if it is a whole number >= ``minimum`` (a bool is not), else a :class:`SettingError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SettingError(f"{name}={value!r}: give a whole number >= {minimum}")
    return value


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


# ---------------------------------------------------------------------------------------------
# A notebook's own knobs (its parameter cell)

#: How :func:`knob` describes each type it converts to, in its error.
_KNOB_FORMS = {bool: "1, 0, true or false", int: "a whole number", float: "a number", str: "any text"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _convert(raw: str, kind: type):
    if kind is bool:
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(raw)
    return kind(raw)


def knob(name: str, default, environ: dict | None = None):
    """The value of environment variable ``name`` converted to ``default``'s type, else ``default``.

    For a notebook's parameter cell: ``MAX_NEW_TOKENS = knob("TRNLAB_MAX_NEW_TOKENS", 20)`` reads
    ``TRNLAB_MAX_NEW_TOKENS=40`` as ``40``; unset or empty gives ``20``. The type comes from the
    default: ``int``, ``float``, ``bool`` (``1``/``0``/``true``/``false``) or ``str``; a default of
    ``None`` gives the text or ``None``. The course settings (``TRNLAB_DEVICE``, ``TRNLAB_DTYPE``,
    ``TRNLAB_CPU_THREADS``) get :func:`read_settings`' own check. A value that does not convert
    raises :class:`SettingError` naming the variable and the form expected, before anything runs.
    """
    env = os.environ if environ is None else environ
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if name in _READERS and name != MODEL_ENV_VAR:
        return _READERS[name][1](raw, name)
    kind = str if default is None else type(default)
    if kind not in _KNOB_FORMS:
        raise TypeError(f"knob({name!r}, default={default!r}): the default must be an int, float, bool, str "
                        "or None, so the variable's type is known")
    try:
        return _convert(raw, kind)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not {_KNOB_FORMS[kind]}: give {_KNOB_FORMS[kind]} "
                           f"(e.g. {name}={default!r}, the default), or unset it for the default") from None


# ---------------------------------------------------------------------------------------------
# Settings changed for the length of a block


def _put_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)


@contextlib.contextmanager
def environment(**variables: str | None):
    """Inside the block, set each environment variable (``None``: unset it); restore exactly those after.

    ``with environment(ACCELERATE_DYNAMO_USE_DYNAMIC="false"): ...``. Only the named variables
    are restored, so what the libraries set inside the block for the rest of the process (an
    Accelerate state's ``RANK``, ``LOCAL_RANK``...) stays, unlike ``mock.patch.dict(os.environ)``,
    which puts back the whole environment.
    """
    saved = {name: os.environ.get(name) for name in variables}
    for name, value in variables.items():
        _put_variable(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            _put_variable(name, value)


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """Show Transformers' progress bars inside the block only if ``enabled`` (loading bars clutter notebooks).

    Whatever the bars were before the block, they are put back after it.
    """
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


@contextlib.contextmanager
def quiet_transformers(*, logs: bool = True, hide_progress_bars: bool = False):
    """Inside the block, Transformers logs errors only (``logs``) and draws no progress bars
    (``hide_progress_bars``); both are restored after.

    The course uses it where Transformers' output would mislead or clutter: ``TrainingArguments``
    warns "the speedups for torchdynamo mostly come with GPU Ampere" on any machine without a GPU,
    Trainium included.
    """
    from transformers.utils import logging

    level = logging.get_verbosity()
    if logs:
        logging.set_verbosity_error()
    try:
        with progress_bars(False) if hide_progress_bars else contextlib.nullcontext():
            yield
    finally:
        if logs:
            logging.set_verbosity(level)
