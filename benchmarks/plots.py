"""Pictures of a sweep: step time and memory against grid size and against ranks, per strategy,
and bytes sent against ranks beside the analytic curves.

``python -m benchmarks.plots SWEEP_DIR`` draws them again from a sweep's stored rows (or from a
results table in Markdown, e.g. one copied into the docs).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, Formatter, LogLocator, NullLocator  # noqa: E402

from benchmarks.results import MIB, SENT_LAYER_COLUMN, load_rows, markdown_rows  # noqa: E402

# Keys that may vary in a sweep besides a plot's x axis and panels; the varying ones name the lines.
_LINE_KEYS = ["strategy", "ranks", "num_layers", "num_channels", "window_size", "batch_size", "precision"]
_MARKERS = {"none": "o", "shard_heads": "s", "shard_sequence": "^", "shard_channels": "D", "shard_hybrid": "P"}
_LINESTYLES = ["-", "--", "-.", ":"]
DPI = 110
PANEL_SIZE_IN = (4.6, 3.4)
LEGEND_WIDTH_IN = 2.8
MIN_WIDTH_IN = 10.0
X_LABELS = {"points": "grid size (points)", "ranks": "ranks P (processes)"}

Metric = tuple[str, Callable[[dict[str, Any]], float]]


def plain_number(value: float) -> str:
    """A tick value as a plain decimal, at most three significant digits below 100: 0.15, 1, 40320."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    if abs(value) >= 100:
        return f"{round(value):d}"
    return np.format_float_positional(value, precision=3, fractional=False, trim="-")


class PlainLogFormatter(Formatter):
    """Plain numbers on a log axis (no ``1.5x10^-1``). Major ticks are all labelled; minor ones
    only where the axis spans few decades: all under one decade, the 2, 3 and 5 multiples under
    two, the 2 and 5 multiples under three, none beyond."""

    def __init__(self, minor: bool = False) -> None:
        self.minor = minor

    def __call__(self, x: float, pos: int | None = None) -> str:
        if x <= 0:
            return ""
        if not self.minor:
            return plain_number(x)
        low, high = sorted(self.axis.get_view_interval()) if self.axis is not None else (x, x)
        span = math.log10(high / low) if low > 0 else math.inf
        mantissa = round(x / 10 ** math.floor(math.log10(x) + 1e-9))
        keep = range(1, 10) if span < 1 else {2, 3, 5} if span < 2 else {2, 5} if span < 3 else set()
        return plain_number(x) if mantissa in keep else ""


def log_axes(ax: Axes, x_values: list[float], x_base: int) -> None:
    """Log x and y with plain tick labels; the x ticks at the measured values when few. Call it
    after plotting: the y ticks follow the data's span."""
    ax.set_xscale("log", base=x_base)
    ax.set_yscale("log")
    xs = sorted(set(x_values))
    if len(xs) <= 8:
        ax.xaxis.set_major_locator(FixedLocator(xs))
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        ax.xaxis.set_minor_formatter(PlainLogFormatter(minor=True))
    ax.xaxis.set_major_formatter(PlainLogFormatter())
    ax.yaxis.set_major_formatter(PlainLogFormatter())
    ax.yaxis.set_minor_formatter(PlainLogFormatter(minor=True))
    ax.tick_params(axis="both", which="both", labelsize=9)
    ax.margins(x=0.08, y=0.1)
    low, high = ax.get_ylim()
    if 0 < low and math.log10(high / low) < 0.5:  # under half a decade: ticks at 1.5 and 2.5 too
        ax.yaxis.set_minor_locator(LogLocator(subs=(1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)))
    ax.grid(alpha=0.3, which="both")


def series_style(index: int, strategy: str) -> dict[str, Any]:
    """Marker by strategy, colour and line style by series; hollow markers shrinking with the
    index, so series that share a point (every strategy's one-rank start) stay visible."""
    return {
        "color": f"C{index % 10}",
        "marker": _MARKERS.get(strategy, "o"),
        "linestyle": _LINESTYLES[index % len(_LINESTYLES)],
        "markersize": max(4.0, 11.0 - 1.5 * index),
        "markerfacecolor": "none",
        "markeredgewidth": 1.6,
        "linewidth": 1.6,
        "alpha": 0.9,
    }


def _figure(n_rows: int, n_cols: int) -> tuple[Figure, np.ndarray]:
    """Panels of PANEL_SIZE_IN with room for the legend on the right, at least MIN_WIDTH_IN wide."""
    width = max(MIN_WIDTH_IN, PANEL_SIZE_IN[0] * n_cols + LEGEND_WIDTH_IN)
    fig = plt.figure(figsize=(width, PANEL_SIZE_IN[1] * n_rows + 0.6), layout="constrained")
    return fig, fig.subplots(n_rows, n_cols, squeeze=False)


def _save(fig: Figure, handles: list[Line2D], title: str, path: Path) -> Path:
    """Legend outside the panels, title above them, written at DPI."""
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _label(row: dict[str, Any], keys: list[str]) -> str:
    """A line's legend entry: its strategy and the other varying settings (the strategy alone
    when nothing varies: an empty label would show as matplotlib's ``_child0``)."""
    return ", ".join(f"{k}={row[k]}" if k != "strategy" else str(row[k]) for k in keys) or str(row["strategy"])


def _varying(rows: list[dict[str, Any]], exclude: set[str]) -> list[str]:
    """The line keys that take more than one value in ``rows``."""
    return [k for k in _LINE_KEYS if k not in exclude and len({r.get(k) for r in rows}) > 1]


def _panel_order(rows: list[dict[str, Any]], panel_key: str) -> list[Any]:
    """Grids by their number of points, other panel values (layer counts) by value."""
    if panel_key == "grid":
        return sorted({r["grid"] for r in rows}, key=lambda g: min(r["points"] for r in rows if r["grid"] == g))
    return sorted({r[panel_key] for r in rows})


def _lines(rows: list[dict[str, Any]], line_keys: list[str], with_baseline: bool) -> dict[str, list[dict[str, Any]]]:
    """One panel's rows by line; with ``with_baseline`` the one-rank point starts every line."""
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        lines[_label(r, line_keys)].append(r)
    if with_baseline:
        base = [r for r in rows if r["ranks"] == 1]
        for pts in lines.values():
            if pts[0]["ranks"] > 1:
                same = [b for b in base if all(b[k] == pts[0][k] for k in line_keys if k != "strategy")]
                pts.extend(same[:1])
    return lines


def _panels(
    rows: list[dict[str, Any]], panel_key: str, x_key: str, metrics: list[Metric], path: Path, title: str
) -> Path | None:
    """One column per value of ``panel_key``, one row per metric, one line per varying setting."""
    if not rows:
        return None
    panels = _panel_order(rows, panel_key)
    line_keys = _varying(rows, {panel_key, x_key})
    labels = sorted({_label(r, line_keys) for r in rows})
    fig, axes = _figure(len(metrics), len(panels))
    handles: dict[str, Line2D] = {}
    for j, panel in enumerate(panels):
        lines = _lines([r for r in rows if r[panel_key] == panel], line_keys, with_baseline=x_key == "ranks")
        for i, (name, value) in enumerate(metrics):
            ax = axes[i][j]
            for label, pts in sorted(lines.items()):
                pts = sorted(pts, key=lambda r: r[x_key])
                style = series_style(labels.index(label), pts[-1]["strategy"])
                (handles[label],) = ax.plot([r[x_key] for r in pts], [value(r) for r in pts], label=label, **style)
            log_axes(ax, [r[x_key] for r in rows if r[panel_key] == panel], 2 if x_key == "ranks" else 10)
            ax.set_ylabel(name)
            ax.set_title(f"{panel_key} = {panel}" if i == 0 else "")
            ax.set_xlabel(X_LABELS[x_key] if i == len(metrics) - 1 else "")
    return _save(fig, [handles[k] for k in labels if k in handles], title, path)


_TIME_MEMORY: list[Metric] = [
    ("step time (s)", lambda r: r["step_time_s"]),
    ("peak memory/rank (MiB)", lambda r: max(r["peak_increase_bytes_max"], 1) / MIB),
]


def time_memory_vs_grid(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Step time and peak memory per rank against grid points, a panel per layer count."""
    return _panels(rows, "num_layers", "points", _TIME_MEMORY, path, "forward+backward vs grid size")


def time_memory_vs_ranks(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Step time and peak memory per rank against ranks, a panel per grid."""
    return _panels(rows, "grid", "ranks", _TIME_MEMORY, path, "forward+backward vs ranks")


def _bytes_panel(ax: Axes, rows: list[dict[str, Any]], line_keys: list[str], labels: list[str]) -> list[Line2D]:
    """Counted (markers) and analytic (dashed) bytes per rank per layer on one grid's panel."""
    lines: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        lines[_label(r, line_keys)][r["ranks"]] = r  # bytes per layer do not depend on the layer count
    handles = []
    for label, by_ranks in sorted(lines.items()):
        ranks = sorted(by_ranks)
        pts = [by_ranks[p] for p in ranks]
        style = series_style(labels.index(label), pts[0]["strategy"]) | {"linestyle": "none"}
        analytic = [r["analytic_bytes_per_layer_max"] / MIB for r in pts]
        ax.plot(ranks, analytic, "--", color=style["color"], linewidth=1.2, alpha=0.8)
        counted = [r["bytes_sent_per_layer_max"] / MIB for r in pts]
        (line,) = ax.plot(ranks, counted, label=f"{label} counted", **style)
        handles.append(line)
    log_axes(ax, [r["ranks"] for r in rows], 2)
    return handles


def bytes_vs_ranks(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Counted bytes per rank per layer (markers) and the analytic formula (dashed)."""
    rows = [r for r in rows if r["ranks"] > 1]
    if not rows:
        return None
    grids = _panel_order(rows, "grid")
    line_keys = _varying(rows, {"grid", "ranks", "num_layers"})
    labels = sorted({_label(r, line_keys) for r in rows})
    fig, axes = _figure(1, len(grids))
    handles: dict[str, Line2D] = {}
    for ax, grid in zip(axes[0], grids):
        for line in _bytes_panel(ax, [r for r in rows if r["grid"] == grid], line_keys, labels):
            handles[str(line.get_label())] = line
        ax.set_title(f"grid = {grid}")
        ax.set_xlabel(X_LABELS["ranks"])
        ax.set_ylabel(SENT_LAYER_COLUMN)
    formula = Line2D([], [], color="grey", linestyle="--", label="analytic formula")
    title = "bytes sent per rank per layer, forward+backward (most loaded rank)"
    return _save(fig, [*sorted(handles.values(), key=lambda h: str(h.get_label())), formula], title, path)


PLOTS = {
    "time_memory_vs_grid": time_memory_vs_grid,
    "time_memory_vs_ranks": time_memory_vs_ranks,
    "bytes_vs_ranks": bytes_vs_ranks,
}


def sweep_plots(
    rows: list[dict[str, Any]], directory: Path, name: str = "{target}_{plot}.png", only: list[str] | None = None
) -> list[Path]:
    """Every plot (or those in ``only``) for the measured rows, one set per target, named by the
    template ``name``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    ok = [r for r in rows if r.get("status") == "ok"]
    for target in sorted({r.get("target", "processor") for r in ok}):
        mine = [r for r in ok if r.get("target", "processor") == target]
        for plot, draw in PLOTS.items():
            if only is None or plot in only:
                path = draw(mine, directory / name.format(target=target, plot=plot))
                if path is not None:
                    written.append(path)
    return written


def _value(text: str) -> Any:
    """A ``--set`` value: an int where it is one."""
    return int(text) if text.lstrip("-").isdigit() else text


def main(argv: list[str] | None = None) -> list[Path]:
    """``python -m benchmarks.plots SOURCE``: the plots drawn again from stored rows."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=main.__doc__)
    parser.add_argument("source", type=Path, help="a sweep directory (results.jsonl) or a Markdown file")
    parser.add_argument("--out", type=Path, help="folder of the PNGs (default: SOURCE/plots)")
    parser.add_argument("--name", default="{target}_{plot}.png", help="file names, from {target} and {plot}")
    parser.add_argument("--only", help=f"comma-separated plots to draw, of {', '.join(PLOTS)}")
    parser.add_argument("--after", help="Markdown: the first table after the line starting with this")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Markdown: a missing column")
    args = parser.parse_args(argv)
    if args.source.is_dir():
        rows, out = load_rows(args.source), args.out or args.source / "plots"
    else:
        defaults = {k: _value(v) for k, v in (item.split("=", 1) for item in args.set)}
        rows, out = markdown_rows(args.source.read_text(), args.after, defaults), args.out or args.source.parent
    written = sweep_plots(rows, out, args.name, args.only.split(",") if args.only else None)
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    main()
