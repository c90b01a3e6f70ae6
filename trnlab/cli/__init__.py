"""Command-line entry points, one module per ``python -m trnlab`` command: argument parsing only."""

__all__ = []
