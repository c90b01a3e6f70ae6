"""Deprecated: the module ``trnlab.launch`` is now :mod:`trnlab.launcher` (kept for one release).

``import trnlab.launch`` and ``from trnlab.launch import launch, torchrun_command`` keep
working, with a ``FutureWarning``; every name is :mod:`trnlab.launcher`'s own object. Importing
this submodule rebinds the package attribute ``trnlab.launch`` to it, so the module is made
callable: ``trnlab.launch(...)`` still runs :func:`trnlab.launcher.launch`.
"""

from __future__ import annotations

import sys
import types
import warnings

from trnlab import launcher as _launcher

warnings.warn("the module trnlab.launch was renamed trnlab.launcher and will be removed in trnlab 0.3: "
              "write `from trnlab.launcher import launch, torchrun_command` (or call trnlab.launch(...), "
              "the function) instead", FutureWarning, stacklevel=2)


class _CallableLaunchModule(types.ModuleType):
    """This module, callable as :func:`trnlab.launcher.launch`, since it shadows ``trnlab.launch``."""

    def __call__(self, *args, **kwargs):
        return _launcher.launch(*args, **kwargs)

    def __getattr__(self, name: str):
        # Every name of trnlab.launcher, public or not, as the old module had them.
        try:
            return getattr(_launcher, name)
        except AttributeError:
            raise AttributeError(f"module 'trnlab.launch' (now trnlab.launcher) has no attribute {name!r}") from None

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(_launcher)))


sys.modules[__name__].__class__ = _CallableLaunchModule
