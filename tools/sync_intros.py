"""Copy each notebook's measured run time and graph count into its introduction and the README's table.

    python tools/sync_intros.py notebooks/[0-9]*.ipynb          # rewrite the introductions
    python tools/sync_intros.py --check notebooks/[0-9]*.ipynb  # exit 1 if one is out of date

A notebook's last cell, ``print(trnlab.run_summary())``, stores ``this notebook compiled G
graph(s) in T s on DEVICE``; its first markdown cell says "about N s" (or "about N min") and
"G graph(s)". ``make notebooks`` runs this after executing them, so the figures in the prose
are always the stored output's, never typed by hand (tests/test_notebooks.py checks them). The
README's notebook table (between its ``notebook-table`` markers) gets each notebook's graph count in
its fourth column.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SUMMARY = re.compile(r"this notebook compiled (\d+) graph\(s\) in (\d+) s on ")
DURATION = re.compile(r"about \d+ (?:s|min)\b")
GRAPHS = re.compile(r"\b\d+ graph\(s\)")
README = Path(__file__).resolve().parent.parent / "README.md"
TABLE_ROW = re.compile(r"^(\| `(\w+)` \|[^|]*\|[^|]*\| )(\d+)( \|.*)$", re.M)


def intro_duration(seconds: int) -> str:
    """How an introduction says a run time: "about N s" under 90 s (N exact under 10, else nearest 10), else min."""
    if seconds < 10:
        return f"about {max(1, seconds)} s"
    if seconds < 90:
        return f"about {int(seconds / 10 + 0.5) * 10} s"
    return f"about {int(seconds / 60 + 0.5)} min"


def measured(nb: dict) -> tuple[int, int]:
    """``(graphs, seconds)`` from the stored output of the notebook's last code cell."""
    last = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    text = "".join("".join(o.get("text", "")) for o in last.get("outputs", []))
    match = SUMMARY.search(text)
    if not match:
        raise ValueError("its last code cell has no stored run_summary() output: execute the notebook first")
    return int(match.group(1)), int(match.group(2))


def synced_intro(intro: str, graphs: int, seconds: int) -> str:
    """``intro`` with its one duration and its one graph count replaced by the measured ones."""
    if len(DURATION.findall(intro)) != 1 or len(GRAPHS.findall(intro)) != 1:
        raise ValueError("its introduction must say 'about N s' (or 'about N min') and 'G graph(s)' once each")
    intro = DURATION.sub(intro_duration(seconds), intro)
    return GRAPHS.sub(f"{graphs} graph(s)", intro)


def sync(path: Path, check: bool = False) -> bool:
    """Bring ``path``'s introduction up to date; return whether it already was."""
    text = path.read_text()
    nb = json.loads(text)
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    intro = "".join(first["source"])
    new = synced_intro(intro, *measured(nb))
    if new == intro:
        return True
    if not check:
        lines = new.splitlines(keepends=True)
        first["source"] = lines
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return False


def synced_readme(text: str, graphs: dict[str, int]) -> str:
    """``text`` (the README) with each notebook row's last column set to ``graphs[notebook stem]``."""
    head, rest = text.split("<!-- notebook-table", 1)
    table, tail = rest.split("<!-- end of notebook-table -->", 1)
    table = TABLE_ROW.sub(lambda m: f"{m[1]}{graphs.get(m[2], m[3])}{m[4]}", table)
    return f"{head}<!-- notebook-table{table}<!-- end of notebook-table -->{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only report introductions that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in args.notebooks:
        try:
            if not sync(path, check=args.check):
                stale.append(path)
        except ValueError as error:
            print(f"{path}: {error}", file=sys.stderr)
            return 2
    for path in stale:
        print(f"{path}: introduction {'out of date' if args.check else 'updated'} from its run_summary() output")
    readme = README.read_text()
    new = synced_readme(readme, {p.stem: measured(json.loads(p.read_text()))[0] for p in args.notebooks})
    if new != readme:
        stale.append(README)
        print(f"README.md: notebook table {'out of date' if args.check else 'updated'} from run_summary() outputs")
        if not args.check:
            README.write_text(new)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
