"""Every chart of the course: one function per picture, each returns its figure.
They take plain rows (lists of dicts) such as :meth:`trnlab.CompileTracker.table`; matplotlib is imported only to draw.
The text tables are in :mod:`trnlab.tables` (still importable from here)."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from trnlab.instances import GiB, PlanError
from trnlab.memory_model import COMPONENT_LABELS, COMPONENTS, MemoryPlan
# The text tables moved to trnlab.tables; these names keep working from here (notebooks use plots.format_*).
from trnlab.tables import format_steps, format_table, memory_table, placement_table, text_table  # noqa: F401

__all__ = [
    "draw_loss_curve", "plot_buckets", "plot_compile_growth", "plot_generation_comparison", "plot_losses", "plot_mesh",
    "plot_memory_plan", "plot_padding_waste", "plot_strategy_comparison",
]


def plot_compile_growth(runs: Mapping[str, Sequence[dict]], title: str | None = None):
    """Graphs compiled and cumulative compile seconds against requests, one line per run.
    Rows have ``graphs_so_far`` and ``compile_seconds_so_far``; ``shapes_so_far`` adds a dashed line of distinct shapes
    (a gap shows where dynamo's recompile limit stopped compiling)."""
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


def plot_buckets(lengths: Sequence[int], buckets: Sequence[int], ax=None, title: str | None = None):
    """Every prompt as a bar (sorted by length), with the bucket it is padded to drawn above it.
    The shaded part of each bar is padding; ``buckets`` come from :func:`trnlab.choose_buckets`. Returns the figure."""
    import bisect

    import matplotlib.pyplot as plt

    ordered = sorted(int(n) for n in lengths)
    edges = sorted(int(b) for b in buckets)
    padded = [edges[min(bisect.bisect_left(edges, n), len(edges) - 1)] for n in ordered]
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.2))
    else:
        fig = ax.figure
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


def plot_generation_comparison(rows: Sequence[dict], title: str | None = None):
    """Bars per run: first call against steady-state seconds, and steady-state tokens/s.
    Rows have ``label``, ``first_call_seconds``, ``steady_seconds`` and ``steady_tokens_per_second``."""
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


# Training (notebook 04)


def draw_loss_curve(ax, steps: Sequence[int], losses: Sequence[float], compiled_steps: Iterable[int] = (),
                    label: str | None = None, **plot_kwargs):
    """Draw a loss curve on ``ax``, with a dotted line at every step that compiled a graph."""
    line, = ax.plot(steps, losses, marker=".", label=label, **plot_kwargs)
    for step in compiled_steps:
        ax.axvline(step, color=line.get_color(), linestyle=":", alpha=0.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    return line


def plot_strategy_comparison(results: Mapping[str, Mapping]):
    """Bar charts of :meth:`TrainingRecorder.summary` dicts, one bar per strategy; returns the figure.
    A panel per figure present (graphs, compile seconds, step time, padding waste, real tokens/s, final loss); "n/a"
    marks a missing value."""
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


# Sharding (notebook 05)


def plot_mesh(ranks: list[dict], names: list[str], ax=None):
    """Draw the fsdp x tp device mesh: one box per rank with the weight rows it holds; returns the axes.
    Each row of the grid is a TP group (fed the same batch slice), each column an FSDP group."""
    import matplotlib.pyplot as plt

    fsdp_size, tp_size = ranks[0]["fsdp_size"], ranks[0]["tp_size"]
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2 * tp_size, 2.3 * fsdp_size + 0.6))
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
    ax.set_xlim(0, tp_size)
    ax.set_ylim(0, fsdp_size)
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

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    markers = "ox+s"
    for r in ranks:
        ax.plot(r["losses"], ls="none", marker=markers[r["rank"] % len(markers)], mfc="none", ms=8 - r["rank"],
                label=f"rank {r['rank']} (fsdp {r['fsdp']}, tp {r['tp']})")
    ax.plot(ranks[0]["losses"], color="black", lw=1, label="sharded Trainer, global batch")
    if reference is not None:
        ax.plot(reference, color="red", ls="--", lw=1.5, label="one-process Trainer, same data")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7)
    return ax


def plot_memory_plan(plans, budget: int | None = None, ax=None, title: str | None = None):
    """Stacked bars of bytes per rank by component, one bar per mesh; returns the figure.
    ``plans``: a :class:`~trnlab.planning.MeshPlan` (HBM per core and usable budget drawn as lines), a dict
    ``{label: MemoryPlan}`` or a list of MemoryPlans; ``budget`` is drawn when ``plans`` is not a MeshPlan."""
    import matplotlib.pyplot as plt

    hbm = None
    if hasattr(plans, "candidates") and hasattr(plans, "instance"):   # a MeshPlan (planning imports this module)
        mesh_plan = plans
        hbm, budget = mesh_plan.instance.hbm_per_core, budget or mesh_plan.budget
        title = title or f"{mesh_plan.model}, {mesh_plan.workload} on {mesh_plan.instance.name}"
        plans = mesh_plan.plans
    elif isinstance(plans, MemoryPlan):
        plans = {plans.mesh: plans}
    elif not isinstance(plans, dict):
        plans = {p.mesh: p for p in plans}
    if not plans:
        raise PlanError("nothing to plot: no mesh passed the checks")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(plans) + 1.5) + 3.2, 4.2))
    else:
        fig = ax.figure
    labels = list(plans)
    bottoms = [0.0] * len(labels)
    colors = plt.get_cmap("tab10").colors
    for n, key in enumerate(COMPONENTS):
        values = [plans[label].components[key] / GiB for label in labels]
        if not any(values):
            continue
        ax.bar(labels, values, bottom=bottoms, color=colors[n], label=COMPONENT_LABELS[key])
        bottoms = [b + v for b, v in zip(bottoms, values)]
    if hbm:
        ax.axhline(hbm / GiB, color="black", lw=1, label=f"HBM per core ({hbm / GiB:.0f} GiB)")
    if budget:
        ax.axhline(budget / GiB, color="red", ls="--", lw=1, label=f"usable ({budget / GiB:.1f} GiB)")
    top = max(bottoms + [(hbm or 0) / GiB, (budget or 0) / GiB])
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("GiB per rank (NeuronCore)")
    ax.set_xlabel("mesh")
    ax.tick_params(axis="x", labelsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig
