"""Sweep plots: wide enough, plain log-axis labels, legend and title clear of the data, and
re-drawn from stored rows (today's and older keys) or from a results table."""

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from PIL import Image

from benchmarks import plots
from benchmarks.plots import PlainLogFormatter, log_axes, plain_number, sweep_plots
from benchmarks.results import MIB, SENT_LAYER_COLUMN

STRATEGIES = {"none": 1, "shard_heads": 8, "shard_sequence": 0.5, "shard_channels": 16}


def rows(old_keys: bool = False) -> list[dict[str, Any]]:
    """A small sweep's rows: two grids, four strategies, one to four ranks, two layers."""
    out = []
    for grid, points in (("o48", 10944), ("o96", 40320)):
        for strategy, mib_per_layer in STRATEGIES.items():
            for ranks in (1,) if strategy == "none" else (2, 4):
                per_step = int(mib_per_layer * MIB * 2 * (ranks > 1))
                row = {
                    "status": "ok", "target": "processor", "grid": grid, "points": points, "strategy": strategy,
                    "ranks": ranks, "num_layers": 2, "step_time_s": 0.15 * points / 10944 / ranks**0.5,
                    "step_time_min_s": 0.1, "step_time_max_s": 1.0, "peak_increase_bytes_max": 300 * MIB / ranks,
                }  # fmt: skip
                keys = ("bytes_sent_max", "analytic_bytes_max") if old_keys else (
                    "bytes_sent_per_step_max", "analytic_bytes_per_step_max")  # fmt: skip
                row |= dict.fromkeys(keys, per_step)
                if not old_keys:
                    row |= dict.fromkeys(("bytes_sent_per_layer_max", "analytic_bytes_per_layer_max"), per_step / 2)
                out.append(row)
    return out


@pytest.mark.parametrize(
    "value,text",
    [(0.15, "0.15"), (1.0, "1"), (10.0, "10"), (0.5, "0.5"), (2.5, "2.5"), (40320, "40320"), (1e-3, "0.001")],
)
def test_tick_values_are_plain_numbers(value, text):
    assert plain_number(value) == text
    assert PlainLogFormatter()(value) == text


def tick_labels(fig: Figure) -> list[str]:
    fig.canvas.draw()
    labels = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels += [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_visible()]
    return [t for t in labels if t]


def log_axis_labels(y: list[float]) -> list[str]:
    """The tick labels of ``y`` against ranks 1, 2, 4 on :func:`log_axes`."""
    fig, ax = plt.subplots()
    ax.plot([1, 2, 4], y)
    log_axes(ax, [1, 2, 4], 2)
    labels = tick_labels(fig)
    plt.close(fig)
    return labels


def test_a_narrow_log_axis_labels_its_ticks_plainly():
    labels = log_axis_labels([0.13, 0.2, 0.3])
    assert {"1", "2", "4", "0.15", "0.2", "0.3"} <= set(labels)
    assert not [t for t in labels if "$" in t or "times" in t or "e" in t], labels


def test_a_wide_log_axis_labels_decades_only():
    labels = log_axis_labels([0.01, 1, 100])
    assert {"0.01", "0.1", "1", "10", "100"} <= set(labels)
    assert "0.2" not in labels and "50" not in labels


@pytest.fixture
def kept_figures(monkeypatch) -> list[Figure]:
    """The figures the plot functions draw, kept open instead of closed after saving."""
    kept: list[Figure] = []
    close = plt.close
    monkeypatch.setattr(plots.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_plots_are_wide_with_legend_and_title_clear_of_the_data(tmp_path, kept_figures):
    written = sweep_plots(rows(), tmp_path)
    assert sorted(p.name for p in written) == [
        "processor_bytes_vs_ranks.png", "processor_time_memory_vs_grid.png", "processor_time_memory_vs_ranks.png"
    ]  # fmt: skip
    assert all(Image.open(p).size[0] >= 1000 for p in written)
    for fig in kept_figures:
        renderer = fig.canvas.get_renderer()
        whole = fig.bbox
        (legend,) = fig.legends
        title = fig._suptitle.get_window_extent(renderer)
        assert whole.x0 <= title.x0 and title.x1 <= whole.x1 and title.y1 <= whole.y1  # not clipped
        for ax in fig.axes:
            assert not overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
            assert ax.get_xlabel() == "" or "(" in ax.get_xlabel()  # units
            assert "(" in ax.get_ylabel()
            assert not [t for t in tick_labels(fig) if "$" in t]
    bytes_fig = kept_figures[-1]
    assert {ax.get_ylabel() for ax in bytes_fig.axes} == {SENT_LAYER_COLUMN}


def test_series_sharing_a_point_keep_distinct_hollow_markers(tmp_path, kept_figures):
    plots.time_memory_vs_ranks(rows(), tmp_path / "p.png")
    ax = kept_figures[0].axes[0]
    at_one_rank = [line for line in ax.get_lines() if 1 in list(line.get_xdata())]
    assert len(at_one_rank) == 4  # none and every sharded strategy start at the one-rank point
    assert len({(line.get_marker(), line.get_markersize()) for line in at_one_rank}) == 4
    assert all(line.get_markerfacecolor() == "none" for line in at_one_rank)


def test_the_cli_redraws_a_sweep_stored_under_older_keys(tmp_path):
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(old_keys=True)))
    written = plots.main([str(tmp_path), "--name", "x_{plot}.png", "--only", "bytes_vs_ranks"])
    assert written == [tmp_path / "plots" / "x_bytes_vs_ranks.png"]
    assert Image.open(written[0]).size[0] >= 1000


def test_the_cli_redraws_from_a_markdown_table(tmp_path):
    doc = Path(__file__).parents[2] / "docs" / "benchmarks" / "processor_sweep_x86-avx512_2026-11-21.md"
    args = [str(doc), "--after", "## Processor forward+backward at o48", "--set", "num_layers=2"]
    written = plots.main([*args, "--set", "target=processor", "--out", str(tmp_path)])
    assert len(written) == 3 and all(Image.open(p).size[0] >= 1000 for p in written)
