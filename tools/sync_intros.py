"""Copy each notebook's measured run time and graph count into its introduction and the README's table.

    python tools/sync_intros.py notebooks/[0-9]*.ipynb          # rewrite the introductions
    python tools/sync_intros.py --check notebooks/[0-9]*.ipynb  # exit 1 if one is out of date

A notebook's last cell, ``print(trnlab.run_summary())``, stores ``this notebook compiled G
graph(s) in T s on DEVICE``; its first markdown cell says "about N s" (or "about N min") and
"G graph(s)". ``make notebooks`` runs this after executing them, so the figures in the prose
are always the stored output's, never typed by hand (tests/test_notebooks.py checks them). The
README's notebook table (between its ``notebook-table`` markers) gets each notebook's graph count in
its fourth column. Stored on Neuron (the stand-in or a trn2), the last cell also prints the NEFFs from
``torch.neuron.get_dynamo_metrics()``, forward, backward and inference apart: they go into the
introduction's "N NEFF(s) (F forward, B backward, I inference)" and the README's ``neff-table``.
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
NEFF_SUMMARY = re.compile(r"get_dynamo_metrics\(\): (\d+) .*?\((\d+) forward, (\d+) backward, (\d+) inference")
NEFFS = re.compile(r"\b\d+ NEFF\(s\) \(\d+ forward, \d+ backward, \d+ inference\)")
NEFF_ROW = re.compile(r"^\| (`\w+`|\*\*total\*\*) \| \d+ \| \d+ \| \d+ \| \d+ \|$", re.M)


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


def stored_neffs(nb: dict) -> tuple[int, int, int, int] | None:
    """``(NEFFs, forward, backward, inference)`` from the last code cell's stored output; ``None`` off Neuron."""
    last = [c for c in nb["cells"] if c["cell_type"] == "code"][-1]
    match = NEFF_SUMMARY.search("".join("".join(o.get("text", "")) for o in last.get("outputs", [])))
    return tuple(int(n) for n in match.groups()) if match else None


def synced_intro(intro: str, graphs: int, seconds: int, neffs: tuple[int, int, int, int] | None = None) -> str:
    """``intro`` with its one duration, its one graph count and (given ``neffs``) its one NEFF count replaced."""
    if len(DURATION.findall(intro)) != 1 or len(GRAPHS.findall(intro)) != 1 or len(NEFFS.findall(intro)) > 1:
        raise ValueError("its introduction must say 'about N s' (or 'about N min') and 'G graph(s)' once each, "
                         "and 'N NEFF(s) (F forward, B backward, I inference)' at most once")
    intro = DURATION.sub(intro_duration(seconds), intro)
    if neffs is not None:
        intro = NEFFS.sub("{} NEFF(s) ({} forward, {} backward, {} inference)".format(*neffs), intro)
    return GRAPHS.sub(f"{graphs} graph(s)", intro)


def sync(path: Path, check: bool = False) -> bool:
    """Bring ``path``'s introduction up to date; return whether it already was."""
    text = path.read_text()
    nb = json.loads(text)
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    intro = "".join(first["source"])
    new = synced_intro(intro, *measured(nb), stored_neffs(nb))
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


def synced_neff_table(text: str, neffs: dict[str, tuple[int, int, int, int]]) -> str:
    """``text`` (the README) with each ``neff-table`` row set to ``neffs[notebook stem]`` and its total row summed."""
    head, rest = text.split("<!-- neff-table", 1)
    table, tail = rest.split("<!-- end of neff-table -->", 1)
    rows = {m[1].strip("`"): m[0] for m in NEFF_ROW.finditer(table) if m[1].startswith("`")}
    figures = {name: neffs.get(name, tuple(int(n) for n in re.findall(r"\d+", row.split("|", 2)[2])))
               for name, row in rows.items()}
    total = tuple(sum(column) for column in zip(*figures.values()))
    table = NEFF_ROW.sub(lambda m: "| {} | {} | {} | {} | {} |".format(
        m[1], *(total if m[1] == "**total**" else figures[m[1].strip("`")])), table)
    return f"{head}<!-- neff-table{table}<!-- end of neff-table -->{tail}"


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
    stored = {p.stem: json.loads(p.read_text()) for p in args.notebooks}
    neffs = {name: stored_neffs(nb) for name, nb in stored.items()}
    for name in sorted(name for name, figures in neffs.items() if figures is None):
        print(f"{name}: its last cell shows no NEFF count (stored off Neuron?), so its NEFF figures stay as they are "
              "(re-execute it with TRNLAB_NEURON_STANDIN=1 TRNLAB_DTYPE=bfloat16)", file=sys.stderr)
    new = synced_readme(readme, {name: measured(nb)[0] for name, nb in stored.items()})
    new = synced_neff_table(new, {name: figures for name, figures in neffs.items() if figures is not None})
    if new != readme:
        stale.append(README)
        state = "out of date" if args.check else "updated"
        print(f"README.md: notebook and NEFF tables {state} from run_summary() outputs")
        if not args.check:
            README.write_text(new)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
