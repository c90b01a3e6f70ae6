"""The course's settings (``TRNLAB_*``), read from the environment in one place, and the errors trnlab raises.
Torch-free: ``rank_cores`` and the pytest plugin import it before torch."""

from __future__ import annotations

import contextlib
import os
import re
from collections import namedtuple

__all__ = ["TrnlabError", "SettingError", "PlanError", "NotAvailableError", "LaunchError", "whole_number", "knob",
           "progress_bars", "quiet_transformers"]

#: The model to use: a hub name or a folder (unset: the bundled tiny Qwen3).
_MODEL_ENV_VAR = "TRNLAB_MODEL"
#: The device: ``auto`` (neuron > cuda > cpu), ``neuron``, ``cuda``, ``cpu``, or one with an index (``neuron:3``).
_DEVICE_ENV_VAR = "TRNLAB_DEVICE"
#: ``1`` starts the STAND-IN neuron device (:mod:`trnlab.standin`) when torch is imported.
_NEURON_STANDIN_ENV_VAR = "TRNLAB_NEURON_STANDIN"
#: The instance a real run is planned and launched for when none is named (notebook 06).
_DEFAULT_INSTANCE = "trn2.48xlarge"
#: The device types ``TRNLAB_DEVICE`` names, besides ``auto`` (``trnlab.device._BACKENDS`` is this tuple).
_DEVICE_CHOICES = ("neuron", "cuda", "cpu")
_DTYPE_CHOICES = ("auto", "float32", "bfloat16")


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


def whole_number(name: str, value, minimum: int = 1, *, error: type[SettingError] = SettingError) -> int:
    """``value`` if it is a whole number >= ``minimum`` (a bool is not), else ``error`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise error(f"{name}={value!r}: give a whole number >= {minimum}")
    return value


#: The course's settings: model (None: the bundled tiny Qwen3), device, dtype, CPU threads (0: torch's choice).
_Settings = namedtuple("_Settings", "model device dtype cpu_threads")
#: Each setting's variable, its field of :class:`_Settings` and its default, in the order they are read.
_READERS = {_MODEL_ENV_VAR: ("model", None), _DEVICE_ENV_VAR: ("device", "auto"), "TRNLAB_DTYPE": ("dtype", "auto"),
            "TRNLAB_CPU_THREADS": ("cpu_threads", "1")}

#: For each checked field: whether a lower-cased value is valid, and the fix its error names.
_CHECKS = {
    "device": (re.compile(rf"auto|({'|'.join(_DEVICE_CHOICES)})(:\d+)?").fullmatch,
               f" is not a device: use auto, {', '.join(_DEVICE_CHOICES)}, or one of those with an index (e.g. "
               "neuron:3, cuda:0)"),
    "dtype": (_DTYPE_CHOICES.__contains__,
              f" is not a dtype the course uses: choose one of {', '.join(_DTYPE_CHOICES)}"),
    "cpu_threads": (str.isdigit, ": give a whole number of threads >= 0 (0 leaves torch's choice), e.g. 1"),
}


def _check(field: str, value, source: str | None = None):
    """``value`` for ``field`` ("device", "dtype", "cpu_threads") lower-cased (threads: an int), or a SettingError."""
    name = str(value).strip().lower()
    name = name.removeprefix("torch.") if field == "dtype" else name
    valid, fix = _CHECKS[field]
    if not valid(name):
        raise SettingError(f"{source or field}={value!r}{fix}")
    return int(name) if field == "cpu_threads" else name


def _set_value(name: str, environ: dict | None = None) -> str | None:
    """Environment variable ``name`` (None: unset); set but blank, as a shell's ``NAME=`` leaves it, a SettingError."""
    value = (os.environ if environ is None else environ).get(name)
    if value is not None and not value.strip():
        raise SettingError(f"{name}={value!r} is blank: unset it for the default (`unset {name}`), or give it a value")
    return value


def _read_setting(variable: str, environ: dict | None = None):
    """One setting, checked on its own (a bad one elsewhere does not matter); doctor reports every bad one."""
    if variable not in _READERS:
        raise KeyError(f"{variable!r} is not a course setting: one of {', '.join(_READERS)}")
    field, default = _READERS[variable]
    value = _set_value(variable, environ) or default
    return value if value is None or variable == _MODEL_ENV_VAR else _check(field, value, variable)


def _setting_problems(environ: dict | None = None) -> dict[str, str]:
    """``{variable: message}`` for every ``TRNLAB_*`` setting that is malformed (empty: all fine)."""
    problems = {}
    for variable in _READERS:
        try:
            _read_setting(variable, environ)
        except SettingError as exc:
            problems[variable] = str(exc)
    return problems


def _read_settings(environ: dict | None = None) -> _Settings:
    """The settings of this process, from ``environ`` (default: ``os.environ``); a bad one is a SettingError."""
    return _Settings(**{field: _read_setting(variable, environ) for variable, (field, _) in _READERS.items()})


#: How :func:`knob` describes each type it converts to, in its error.
_KNOB_FORMS = {bool: "1, 0, true or false", int: "a whole number", float: "a number", str: "any text"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def knob(name: str, default, environ: dict | None = None):
    """Environment variable ``name`` as ``default``'s type (int, float, bool, str; None: text); unset, ``default``.
    ``MAX_NEW_TOKENS = knob("TRNLAB_MAX_NEW_TOKENS", 20)``; a course setting gets its own check, and a blank value or one
    that does not convert raises :class:`SettingError` naming the variable and the fix."""
    raw = _set_value(name, environ)
    if raw is None:
        return default
    raw = raw.strip()
    if name in _READERS and name != _MODEL_ENV_VAR:
        return _check(_READERS[name][0], raw, name)
    kind = str if default is None else type(default)
    if kind not in _KNOB_FORMS:
        raise TypeError(f"knob({name!r}, default={default!r}): the default must be an int, float, bool, str "
                        "or None, so the variable's type is known")
    try:
        if kind is bool and raw.lower() not in _TRUE + _FALSE:
            raise ValueError(raw)
        return raw.lower() in _TRUE if kind is bool else kind(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not {_KNOB_FORMS[kind]}: give {_KNOB_FORMS[kind]} "
                           f"(e.g. {name}={default!r}, the default), or unset it for the default") from None


def _put_variables(variables: dict) -> None:
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


@contextlib.contextmanager
def _environment(**variables: str | None):
    """Inside the block, set each environment variable (``None``: unset it); restore only those after."""
    saved = {name: os.environ.get(name) for name in variables}
    _put_variables(variables)
    try:
        yield
    finally:
        _put_variables(saved)


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """Show Transformers' progress bars inside the block only if ``enabled``; put back as they were after it."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


@contextlib.contextmanager
def quiet_transformers(*, logs: bool = True, hide_progress_bars: bool = False):
    """Inside the block, Transformers logs errors only (``logs``) and draws no progress bars (``hide_progress_bars``).
    Both are restored after. Used where its output misleads: ``TrainingArguments`` warns about "GPU Ampere" off GPUs."""
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
