"""Every text table of the course: results as aligned columns, for printing in a cell or a terminal.
They take plain rows like the plots do, or a plan; this module imports nothing of trnlab or torch, so it stays light."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:  # annotations only: a plan is told apart by its fields
    from trnlab.memory_model import MemoryPlan
    from trnlab.planning import MeshPlan

__all__ = ["format_plan", "format_steps", "format_table", "memory_table", "placement_table", "text_table"]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def text_table(rows: list[list[str]]) -> str:
    """Rows of strings as aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
                     for row in rows)


def format_table(results: Mapping[str, Mapping], columns: Sequence[str] | None = None) -> str:
    """A plain-text table of summary dicts, one row per strategy (numbers rounded for reading)."""
    columns = list(columns or next(iter(results.values())).keys())
    return text_table([["strategy", *columns]] +
                       [[name, *(_cell(r.get(c)) for c in columns)] for name, r in results.items()])


def format_steps(recorder,
                 columns: Sequence[str] = ("step", "shape", "new_graphs", "graphs_so_far")) -> str:
    """A plain-text table of the recorder's steps, with the chosen :class:`StepRecord` fields."""
    return text_table([list(columns)] + [[_cell(getattr(s, c)) for c in columns] for s in recorder.steps])


# Sharding (notebook 05)


def memory_table(ranks: list[dict]) -> str:
    """Per-rank parameter bytes against the single-process size, as a text table."""
    full = ranks[0]["full_bytes"]
    lines = [f"{'rank':>4}  {'fsdp':>4}  {'tp':>2}  {'parameters':>10}  {'bytes':>10}  {'of 1 process':>12}"]
    for r in ranks:
        count = sum(math.prod(p["local_shape"]) for p in r["parameters"])
        lines.append(f"{r['rank']:>4}  {r['fsdp']:>4}  {r['tp']:>2}  {count:>10,}  {r['local_bytes']:>10,}  "
                     f"{r['local_bytes'] / full:>11.1%}")
    total = sum(r["local_bytes"] for r in ranks)
    lines.append(f"{'all':>4}  {'':>4}  {'':>2}  {'':>10}  {total:>10,}  {total / full:>11.1%}")
    lines.append(f"one process holds {full:,} bytes ({ranks[0]['full_bytes'] // 4:,} fp32 values)")
    return "\n".join(lines)


def placement_table(ranks: list[dict], names: list[str]) -> str:
    """For each parameter in ``names``: every rank's local shape, placements and rows/cols held."""
    lines = []
    for name in names:
        first = next(p for p in ranks[0]["parameters"] if p["name"] == name)
        lines.append(f"{name}  full shape {tuple(first['shape'])}")
        for r in ranks:
            p = next(p for p in r["parameters"] if p["name"] == name)
            placement = ", ".join(f"{k}: {v}" for k, v in p["placements"].items()) or "not sharded"
            held = f"rows {p.get('rows', '-')}" + (f", cols {p['cols']}" if p.get("cols", "-") != "-" else "")
            lines.append(f"  rank {r['rank']} (fsdp {r['fsdp']}, tp {r['tp']}): {str(tuple(p['local_shape'])):<11}"
                         f" {held:<26} [{placement}]")
    return "\n".join(lines)


def format_plan(plan: MeshPlan | MemoryPlan, *, shards: bool = False) -> str:
    """A plan as text: a mesh plan's every mesh and recommendation, or a memory plan's components.
    A :class:`~trnlab.planning.MeshPlan` gives its summary, every mesh and the recommended mesh's components; a
    :class:`~trnlab.memory_model.MemoryPlan` its summary and components. ``shards=True`` adds one line per tensor."""
    if hasattr(plan, "candidates") and hasattr(plan, "recommended"):   # a MeshPlan
        parts = [plan.describe(), "", plan.table()]
        if plan.recommended is not None:
            parts += ["", f"recommended mesh, per rank: {plan.recommended.plan.describe()}",
                      plan.recommended.plan.table()]
            memory = plan.recommended.plan
        else:
            memory = None
    elif hasattr(plan, "components") and hasattr(plan, "shards"):     # a MemoryPlan
        parts = [plan.describe(), plan.table()]
        memory = plan
    else:
        raise TypeError(f"format_plan takes a MeshPlan or a MemoryPlan, not {type(plan).__name__}")
    if memory is not None:
        parts += [""] + [f"note: {n}" for n in memory.notes]
        if shards:
            parts += ["", f"{'tensor':<48} {'shape':>16} {'tp style':>24} {'on this rank':>16}"]
            parts += [f"{s.name:<48} {str(s.shape):>16} {str(s.tp_style or '-'):>24} {str(s.local_shape):>16}"
                      for s in memory.shards]
    return "\n".join(parts)
