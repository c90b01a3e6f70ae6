"""Interactive controls for the notebooks (ipywidgets, rendered by JupyterLab).
A control only re-runs cheap, already-computed results, so moving it never starts a compile."""

from __future__ import annotations

from typing import Iterable

from trnlab.buckets import padding_by_bucket_count
from trnlab.plots import plot_buckets

__all__ = ["bucket_slider", "bucket_summary"]


def bucket_summary(row: dict) -> str:
    """One line for a row of :func:`trnlab.padding_by_bucket_count`: buckets, pad tokens, waste."""
    return (f"{row['k']} bucket(s) {', '.join(map(str, row['buckets']))}: {row['pad_tokens']} pad tokens, "
            f"{100 * row['padding_waste']:.1f}% of the tokens processed, at most {row['k']} prefill graph(s)")


def bucket_slider(lengths: Iterable[int], max_buckets: int = 8, value: int = 4):
    """A slider for the number of buckets ``k``: it shows the best ``k`` buckets for ``lengths``.
    Each ``k`` prints :func:`bucket_summary` and redraws :func:`trnlab.plots.plot_buckets`; returns the ipywidgets
    ``VBox`` (``.children[0]`` the slider, ``.children[1]`` the line)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    lengths = list(lengths)
    rows = padding_by_bucket_count(lengths, max_buckets)
    slider = widgets.IntSlider(value=min(max(1, value), len(rows)), min=1, max=len(rows), step=1,
                               description="buckets k", continuous_update=False)
    summary = widgets.HTML()
    picture = widgets.Output()

    def show(k: int) -> None:
        row = rows[k - 1]
        summary.value = bucket_summary(row)
        with picture:
            picture.clear_output(wait=True)
            fig = plot_buckets(lengths, row["buckets"])
            plt.show()
            plt.close(fig)

    slider.observe(lambda change: show(change["new"]), names="value")
    show(slider.value)
    return widgets.VBox([slider, summary, picture])
