"""Command-line entry points, one module per ``python -m trnlab`` command.

Each module here only parses arguments and calls the library; the work lives in the
library modules (``launch`` -> :mod:`trnlab.launcher` / :mod:`trnlab.runner`, ``plan`` ->
:mod:`trnlab.planning`). :mod:`trnlab.__main__` dispatches to them.
"""

__all__ = []
