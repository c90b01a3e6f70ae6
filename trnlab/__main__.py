"""``python -m trnlab COMMAND``: the course's command line.
Commands in :data:`COMMANDS` are imported only when run, so ``doctor`` works even when an optional part is broken."""

from __future__ import annotations

import importlib
import sys

#: command words -> "module:function"; the function takes the remaining argv, returns an exit code.
COMMANDS = {
    ("doctor",): "trnlab.doctor:main",
    ("bench", "generate"): "trnlab.bench.generate:main",
    ("bench", "train"): "trnlab.bench.train:main",
    ("launch",): "trnlab.cli.launch:main",
    ("plan",): "trnlab.cli.plan:main",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words, target in sorted(COMMANDS.items(), key=lambda item: -len(item[0])):
        if tuple(argv[: len(words)]) == words:
            module, function = target.split(":")
            return getattr(importlib.import_module(module), function)(argv[len(words):])
    usage = "\n".join(f"  python -m trnlab {' '.join(words)}" for words in COMMANDS)
    print(f"usage: one of\n{usage}\n(add --help after a command for its options)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
