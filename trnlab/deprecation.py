"""Renamed names and keywords: they keep working for one release and say what to write instead.

* :func:`warn_deprecated`: the one ``FutureWarning`` text every deprecated name uses;
* :func:`renamed_keywords`: a decorator that accepts a keyword's old name, with that warning;
* :func:`moved_names`: a module's ``__getattr__`` for names that moved to another module;
* :class:`SummaryDict`: what ``summary()`` returns on a class whose ``summary()`` was text: the
  figures as a dict, still acting as the text (now ``describe()``'s) where a string was expected.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings

__all__ = ["REMOVED_IN", "SummaryDict", "moved_names", "renamed_keywords", "warn_deprecated"]

#: The release that removes every deprecated name.
REMOVED_IN = "trnlab 0.3"


def warn_deprecated(old: str, write: str, stacklevel: int = 3) -> None:
    """Warn (``FutureWarning``) that ``trnlab.<old>`` is deprecated: write ``write`` instead."""
    warnings.warn(f"trnlab.{old} is deprecated and will be removed in {REMOVED_IN}: write {write} instead",
                  FutureWarning, stacklevel=stacklevel)


def renamed_keywords(**new_names: str):
    """Decorator: ``f(old=...)`` still works as ``f(new=...)``, with a ``FutureWarning`` naming ``new``.

    ``@renamed_keywords(max_length="length")``. Passing both names raises ``TypeError``.
    """
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for old, new in new_names.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{function.__name__} got {new}= and {old}= (its old name): pass {new}= only")
                warn_deprecated(f"{function.__name__}({old}=...)", f"{function.__name__}(..., {new}=...)")
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def moved_names(module: str, moved: dict):
    """A module ``__getattr__`` (PEP 562) under which names that left ``module`` still resolve, with a warning.

    ``moved``: ``{name: new_module}``, or ``{name: (new_module, what_to_write)}``; ``what_to_write``
    ``None`` skips the warning (a renamed function that warns when called). The new module is
    imported when an old name is first used: a lazy import, kept for deprecated names only and
    removed with them in trnlab 0.3. Where it points back at a module that imports ``module``
    (planning's old ``main``, now the ``plan`` command's, which imports planning), ``tests/test_imports.py``
    lists the edge, so no such cycle appears unannounced.
    """
    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, write = moved[name] if isinstance(moved[name], tuple) else (moved[name], _new_path(moved[name], name))
        if write is not None:
            warn_deprecated(f"{module.removeprefix('trnlab.')}.{name}", write)
        return getattr(importlib.import_module(target), name)

    __getattr__.moved = dict(moved)   # for the test that every old name still resolves
    return __getattr__


def _new_path(module: str, name: str) -> str:
    """What to write for a moved name: ``trnlab.X`` where it is top level, and its import."""
    top_level = name in getattr(sys.modules.get("trnlab"), "__all__", ())
    return f"trnlab.{name} (or `from {module} import {name}`)" if top_level else f"`from {module} import {name}`"


class SummaryDict(dict):
    """A ``summary()`` dict that, until trnlab 0.3, also acts as the one-line text it replaced.

    Every trnlab ``summary()`` returns a dict and ``describe()`` the one-line text. Where a class's
    ``summary()`` used to return that text, it returns ``SummaryDict(owner, text, figures)``:
    ``print`` and ``str`` still give the text, and string use (``+``, ``in`` a key it lacks, ``==``
    a string, string methods) still works with a ``FutureWarning`` saying to call ``describe()``.
    """

    def __init__(self, owner: str, text: str, figures: dict):
        super().__init__(figures)
        self._owner, self._text = owner, text

    def _as_text(self, what: str) -> str:
        warn_deprecated(f"{self._owner}.summary() used as text ({what})",
                        f"{self._owner}.describe() for the one-line text (summary() now returns a dict, "
                        "like every trnlab summary())", stacklevel=4)
        return self._text

    def __str__(self) -> str:  # print(x.summary()) keeps printing the line
        return self._text

    def __format__(self, spec: str) -> str:
        return format(self._text, spec)

    def __getattr__(self, name: str):
        if name.startswith("_") or not hasattr(str, name):
            raise AttributeError(f"'dict' object has no attribute {name!r}")
        return getattr(self._as_text(f".{name}()"), name)

    def __contains__(self, key) -> bool:
        if dict.__contains__(self, key) or not isinstance(key, str):
            return dict.__contains__(self, key)
        return key in self._as_text("in")

    def __eq__(self, other) -> bool:
        return self._as_text("==") == other if isinstance(other, str) else dict.__eq__(self, other)

    __hash__ = None

    def __add__(self, other):
        return self._as_text("+") + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other):
        return other + self._as_text("+") if isinstance(other, str) else NotImplemented
