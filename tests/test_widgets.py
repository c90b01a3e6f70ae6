"""trnlab.plots: the bucket slider of notebook 03 shows the chooser's answer for each k; the text tables align."""

from __future__ import annotations

import matplotlib
import pytest

import trnlab
from trnlab import plots

matplotlib.use("Agg")

LENGTHS = [4, 9, 17, 30, 41, 95, 96, 150]


def test_the_slider_line_is_the_chooser_row_for_its_k():
    box = plots.bucket_slider(LENGTHS, max_buckets=4, value=2)
    slider, line, picture = box.children
    rows = trnlab.padding_by_bucket_count(LENGTHS, 4)
    assert (slider.min, slider.max, slider.value) == (1, 4, 2)
    assert line.value == plots._bucket_summary(rows[1])
    slider.value = 4  # what dragging it does
    assert line.value == plots._bucket_summary(rows[3])
    assert line.value.startswith(f"4 bucket(s) {', '.join(map(str, rows[3]['buckets']))}: "
                                 f"{rows[3]['pad_tokens']} pad tokens")
    slider.value = 1  # one bucket: the longest prompt's length, the most padding
    assert tuple(rows[0]["buckets"]) == (150,) and line.value.startswith("1 bucket(s) 150: ")
    assert f"{rows[0]['pad_tokens']} pad tokens" in line.value


def test_the_slider_clamps_its_start_and_refuses_bad_lengths():
    assert plots.bucket_slider(LENGTHS, max_buckets=3, value=9).children[0].value == 3
    with pytest.raises(ValueError):
        plots.bucket_slider([], max_buckets=3)


def test_plot_buckets_draws_each_prompt_and_its_padding():
    fig = plots._plot_buckets(LENGTHS, [30, 150])
    ax = fig.axes[0]
    padding, prompts = ax.containers
    assert [bar.get_height() for bar in prompts] == sorted(LENGTHS)
    assert [bar.get_height() for bar in padding] == [30, 30, 30, 30, 150, 150, 150, 150]
    assert ax.get_title() == "2 bucket(s): 30, 150"


def test_text_tables_align_first_column_left_and_the_rest_right():
    assert trnlab.format_table is plots.format_table
    assert plots._text_table([["a", "1"], ["bb", "22"]]) == "a    1\nbb  22"
    assert plots.format_table({"fixed": {"steps": 8, "waste": 0.25, "loss": None}}) == (
        "strategy  steps  waste  loss\nfixed         8  0.250     -")
