"""Every chart and text table of the course, and notebook 03's bucket slider; each plot returns its figure or axes.
They take plain rows (lists of dicts) such as :meth:`trnlab.CompileTracker.table`; matplotlib is imported to draw."""

from __future__ import annotations

import bisect
import math
from typing import Iterable, Mapping, Sequence

from trnlab.generation import padding_by_bucket_count

__all__ = ["bucket_slider", "format_steps", "format_table", "memory_table", "placement_table", "plot_compile_growth",
           "plot_losses", "plot_mesh", "plot_padding_waste", "plot_strategy_comparison"]


def plot_compile_growth(runs: Mapping[str, Sequence[dict]], title: str | None = None):
    """Graphs compiled and cumulative compile seconds against requests, one line per run (rows of ``*_so_far`` figures).
    ``shapes_so_far`` adds a dashed line of distinct shapes: a gap shows where the recompile limit stopped compiling."""
    import matplotlib.pyplot as plt

    fig, (graphs_ax, seconds_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, rows in runs.items():
        requests = range(1, len(rows) + 1)
        line, = graphs_ax.step(requests, [r["graphs_so_far"] for r in rows], where="post", marker="o",
                               markersize=3, label=f"{label}: graphs compiled")
        if rows and "shapes_so_far" in rows[0]:
            graphs_ax.step(requests, [r["shapes_so_far"] for r in rows], where="post", linestyle="--",
                           color=line.get_color(), alpha=0.6, label=f"{label}: distinct shapes seen")
        seconds_ax.plot(requests, [r["compile_seconds_so_far"] for r in rows], marker="o", markersize=3,
                        color=line.get_color(), label=label)
    graphs_ax.set(xlabel="request", ylabel="graphs", title="graphs compiled so far", ylim=(0, None))
    seconds_ax.set(xlabel="request", ylabel="seconds", title="time spent compiling so far", ylim=(0, None))
    graphs_ax.legend(fontsize=8)
    seconds_ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_padding_waste(rows: Sequence[dict], title: str | None = None):
    """Padding waste (percent of processed tokens) against the number of buckets ``k``.
    ``rows`` come from :func:`trnlab.padding_by_bucket_count`; each point is labelled with its bucket lengths."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ks = [r["k"] for r in rows]
    percent = [100 * r["padding_waste"] for r in rows]
    ax.plot(ks, percent, marker="o")
    for k, value, row in zip(ks, percent, rows):
        if len(row["buckets"]) <= 4:
            ax.annotate(",".join(map(str, row["buckets"])), (k, value), textcoords="offset points",
                        xytext=(4, 6), fontsize=7)
    ax.set(xlabel="number of buckets k (graph budget)", ylabel="pad tokens, % of tokens processed",
           title=title or "padding waste of the best k buckets")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _plot_buckets(lengths: Sequence[int], buckets: Sequence[int], ax=None, title: str | None = None):
    """Every prompt as a bar (sorted by length), with the bucket it is padded to drawn above it; returns the figure."""
    import matplotlib.pyplot as plt

    ordered = sorted(int(n) for n in lengths)
    edges = sorted(int(b) for b in buckets)
    padded = [edges[min(bisect.bisect_left(edges, n), len(edges) - 1)] for n in ordered]
    fig, ax = plt.subplots(figsize=(7, 3.2)) if ax is None else (ax.figure, ax)
    x = range(len(ordered))
    ax.bar(x, padded, width=1.0, color="tab:orange", alpha=0.35, label="padding")
    ax.bar(x, ordered, width=1.0, color="tab:blue", label="prompt tokens")
    for edge in edges:
        ax.axhline(edge, color="tab:orange", lw=0.8, ls="--")
    ax.set(xlabel="prompts, shortest first", ylabel="tokens",
           title=title or f"{len(edges)} bucket(s): {', '.join(map(str, edges))}")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def _bucket_summary(row: dict) -> str:
    """One line for a row of :func:`trnlab.padding_by_bucket_count`: buckets, pad tokens, waste."""
    return (f"{row['k']} bucket(s) {', '.join(map(str, row['buckets']))}: {row['pad_tokens']} pad tokens, "
            f"{100 * row['padding_waste']:.1f}% of the tokens processed, at most {row['k']} prefill graph(s)")


def bucket_slider(lengths: Iterable[int], max_buckets: int = 8, value: int = 4):
    """An ipywidgets slider for the number of buckets ``k``: each ``k`` shows the best ``k`` buckets for ``lengths``.
    Moving it redraws rows computed once (it never compiles); returns the ``VBox`` (slider, summary line, picture)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    lengths = list(lengths)
    rows = padding_by_bucket_count(lengths, max_buckets)
    slider = widgets.IntSlider(value=min(max(1, value), len(rows)), min=1, max=len(rows), step=1,
                               description="buckets k", continuous_update=False)
    summary, picture = widgets.HTML(), widgets.Output()

    def show(k: int) -> None:
        row = rows[k - 1]
        summary.value = _bucket_summary(row)
        with picture:
            picture.clear_output(wait=True)
            fig = _plot_buckets(lengths, row["buckets"])
            plt.show()
            plt.close(fig)

    slider.observe(lambda change: show(change["new"]), names="value")
    show(slider.value)
    return widgets.VBox([slider, summary, picture])


def plot_strategy_comparison(results: Mapping[str, Mapping]):
    """Bar charts of :meth:`TrainingRecorder.summary` dicts, one bar per strategy; returns the figure.
    A panel per figure present (graphs, compile seconds, step time, waste, tokens/s, loss); "n/a": a missing one."""
    import matplotlib.pyplot as plt

    panels = [("graphs", "graphs compiled"), ("compiling_step_seconds", "seconds in compiling steps"),
              ("steady_step_seconds", "steady step (s)"), ("padding_waste", "padding waste (fraction)"),
              ("real_tokens_per_second", "real tokens / s (steady)"),
              ("real_tokens_per_second_overall", "real tokens / s (all steps)"), ("final_loss", "final loss")]
    panels = [(key, title) for key, title in panels if any(key in r for r in results.values())]
    columns = min(4, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.0 * columns, 2.6 * rows), squeeze=False)
    axes = axes.ravel()
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    names = list(results)
    for axis, (key, title) in zip(axes, panels):
        values = [results[name].get(key) for name in names]
        axis.bar(names, [v or 0 for v in values], color=[f"C{i}" for i in range(len(names))])
        for i, value in enumerate(values):
            if value is None:  # e.g. no steady step: every step compiled
                axis.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return "-" if value is None else str(value)


def _text_table(rows: list[list[str]]) -> str:
    """Rows of strings as aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
                     for row in rows)


def format_table(results: Mapping[str, Mapping], columns: Sequence[str] | None = None) -> str:
    """A plain-text table of summary dicts, one row per strategy (numbers rounded for reading)."""
    columns = list(columns or next(iter(results.values())).keys())
    return _text_table([["strategy", *columns]] +
                       [[name, *(_cell(r.get(c)) for c in columns)] for name, r in results.items()])


def format_steps(recorder, columns: Sequence[str] = ("step", "shape", "new_graphs", "graphs_so_far")) -> str:
    """A plain-text table of the recorder's steps, with the chosen fields of each step (``recorder.steps``)."""
    return _text_table([list(columns)] + [[_cell(getattr(s, c)) for c in columns] for s in recorder.steps])


# Sharding (notebook 05): the rank reports of trnlab.distributed.read_run


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


def plot_mesh(ranks: list[dict], names: list[str], ax=None):
    """Draw the fsdp x tp device mesh: one box per rank with the weight rows it holds; returns the axes.
    Each row of the grid is a TP group (fed the same batch slice), each column an FSDP group."""
    import matplotlib.pyplot as plt

    fsdp_size, tp_size = ranks[0]["fsdp_size"], ranks[0]["tp_size"]
    ax = plt.subplots(figsize=(4.2 * tp_size, 2.3 * fsdp_size + 0.6))[1] if ax is None else ax
    colors = plt.get_cmap("tab20").colors
    for r in ranks:
        x, y = r["tp"], fsdp_size - 1 - r["fsdp"]
        ax.add_patch(plt.Rectangle((x + 0.03, y + 0.04), 0.94, 0.92, color=colors[2 * r["tp"] + r["fsdp"] % 2],
                                   alpha=0.55))
        text = [f"rank {r['rank']}  (fsdp {r['fsdp']}, tp {r['tp']})",
                f"{r['local_bytes'] / 1e6:.2f} MB of {r['full_bytes'] / 1e6:.2f} MB"]
        for name in names:
            p = next(p for p in r["parameters"] if p["name"] == name)
            short = ".".join(name.split(".")[-3:-1]) if "layers" in name else name.split(".")[-2]
            whole = f"0-{p['shape'][1] - 1}" if len(p["shape"]) > 1 else "-"
            cols = f" x cols {p['cols']}" if p.get("cols", "-") not in ("-", whole) else ""
            text.append(f"{short}: rows {p.get('rows', '-')}{cols}")
        ax.text(x + 0.5, y + 0.5, "\n".join(text), ha="center", va="center", fontsize=8, family="monospace")
    ax.set(xlim=(0, tp_size), ylim=(0, fsdp_size))
    ax.set_xticks([i + 0.5 for i in range(tp_size)], [f"tp {i}" for i in range(tp_size)])
    ax.set_yticks([fsdp_size - 1 - i + 0.5 for i in range(fsdp_size)], [f"fsdp {i}" for i in range(fsdp_size)])
    ax.set_title(f"{fsdp_size} x {tp_size} device mesh. Row: one TP group (ranks sharing an fsdp "
                 f"coordinate: same data, the TP pieces of each layer). Column: one TP piece, split again by FSDP", fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return ax


def plot_losses(ranks: list[dict], reference: list[float] | None = None, ax=None):
    """The loss per step each rank's ``Trainer`` logged (the global batch's), and the one-process reference.
    Every rank logs the same loss, so the markers and the dashed reference should lie on one line. Returns the axes."""
    import matplotlib.pyplot as plt

    ax = plt.subplots(figsize=(7, 3.5))[1] if ax is None else ax
    markers = "ox+s"
    for r in ranks:
        ax.plot(r["losses"], ls="none", marker=markers[r["rank"] % len(markers)], mfc="none", ms=8 - r["rank"],
                label=f"rank {r['rank']} (fsdp {r['fsdp']}, tp {r['tp']})")
    ax.plot(ranks[0]["losses"], color="black", lw=1, label="sharded Trainer, global batch")
    if reference is not None:
        ax.plot(reference, color="red", ls="--", lw=1.5, label="one-process Trainer, same data")
    ax.set(xlabel="step", ylabel="loss")
    ax.legend(fontsize=7)
    return ax
