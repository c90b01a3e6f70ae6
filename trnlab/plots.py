"""Small plotting helpers for the notebooks: one function per chart, each returns its figure.

They take plain rows (lists of dicts), e.g. :meth:`trnlab.compile_tracking.CompileTracker.table`
or :meth:`trnlab.generation.WorkloadResult.table`, so they work with any code that makes
such rows. matplotlib is imported inside each function, so importing trnlab stays light.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def plot_compile_growth(runs: Mapping[str, Sequence[dict]], title: str | None = None):
    """Graphs compiled and cumulative compile seconds against requests, one line per run.

    Each run is a list of rows with ``graphs_so_far`` and ``compile_seconds_so_far``; rows
    that also have ``shapes_so_far`` add a dashed line of the distinct shapes seen, so a gap
    between the two shows where compilation stopped (dynamo's recompile limit).
    Notebook 03 plots unbucketed against bucketed generation with it.
    """
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

    ``rows`` come from :func:`trnlab.generation.waste_by_bucket_count`; each point is
    labelled with its bucket lengths. Notebook 03 uses it to pick a graph budget.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ks = [r["k"] for r in rows]
    percent = [100 * r["waste_fraction"] for r in rows]
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


def plot_generation_comparison(rows: Sequence[dict], title: str | None = None):
    """Bars per run: first call against steady-state seconds, and steady-state tokens/s.

    Each row has ``label``, ``first_call_seconds``, ``steady_seconds`` and
    ``steady_tokens_per_second`` (e.g. :func:`trnlab.generation.time_generation` rows).
    Notebook 03's eager-vs-compiled chart.
    """
    import matplotlib.pyplot as plt

    fig, (time_ax, speed_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    labels = [r["label"] for r in rows]
    x = range(len(rows))
    width = 0.38
    time_ax.bar([i - width / 2 for i in x], [r["first_call_seconds"] or 0 for r in rows], width,
                label="first call (includes compiling)")
    time_ax.bar([i + width / 2 for i in x], [r["steady_seconds"] or 0 for r in rows], width,
                label="steady state")
    time_ax.set_yscale("log")
    time_ax.set(ylabel="seconds (log)", title="time per call")
    speed_ax.bar(list(x), [r["steady_tokens_per_second"] or 0 for r in rows], color="tab:green")
    speed_ax.set(ylabel="new tokens / s", title="steady-state throughput")
    for ax in (time_ax, speed_ax):
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8, rotation=20, ha="right")
    time_ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
