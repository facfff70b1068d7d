"""Pictures of a sweep: step time and memory against grid size and against ranks, per strategy,
and bytes sent against ranks beside the analytic curves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Keys that may vary in a sweep besides a plot's x axis and panels; the varying ones name the lines.
_LINE_KEYS = ["strategy", "ranks", "num_layers", "num_channels", "window_size", "batch_size", "precision"]
_MARKERS = {"none": "o", "shard_heads": "s", "shard_sequence": "^", "shard_channels": "D"}


def _label(row: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={row[k]}" if k != "strategy" else str(row[k]) for k in keys)


def _varying(rows: list[dict[str, Any]], exclude: set[str]) -> list[str]:
    return [k for k in _LINE_KEYS if k not in exclude and len({r.get(k) for r in rows}) > 1]


def _panels(
    rows: list[dict[str, Any]],
    panel_key: str,
    x_key: str,
    metrics: list[tuple[str, Callable[[dict[str, Any]], float], str]],
    path: Path,
    title: str,
    with_baseline: bool = False,
) -> Path | None:
    """One column per value of ``panel_key``, one row per metric, one line per varying setting."""
    if not rows:
        return None
    panels = sorted({r[panel_key] for r in rows}, key=lambda v: min(x["points"] for x in rows if x[panel_key] == v))
    line_keys = _varying(rows, {panel_key, x_key})
    fig, axes = plt.subplots(len(metrics), len(panels), figsize=(4.2 * len(panels), 3.2 * len(metrics)), squeeze=False)
    for j, panel in enumerate(panels):
        in_panel = [r for r in rows if r[panel_key] == panel]
        lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in in_panel:
            lines[_label(r, line_keys)].append(r)
        if with_baseline:  # one rank (strategy none) starts every strategy's curve
            base = [r for r in in_panel if r["ranks"] == 1]
            for pts in lines.values():
                if pts[0]["ranks"] > 1:
                    same = [b for b in base if all(b[k] == pts[0][k] for k in line_keys if k not in ("strategy",))]
                    pts.extend(same[:1])
        for i, (name, value, unit) in enumerate(metrics):
            ax = axes[i][j]
            for label, pts in sorted(lines.items()):
                pts = sorted(pts, key=lambda r: r[x_key])
                marker = _MARKERS.get(pts[-1]["strategy"], "o")
                ax.plot([r[x_key] for r in pts], [value(r) for r in pts], marker=marker, label=label)
            ax.set_xscale("log", base=2 if x_key == "ranks" else 10)
            ax.set_yscale("log")
            ax.set_ylabel(f"{name} ({unit})")
            ax.grid(alpha=0.3, which="both")
            if i == 0:
                ax.set_title(f"{panel_key} = {panel}")
            if i == len(metrics) - 1:
                ax.set_xlabel(x_key)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


_TIME_MEMORY = [
    ("step time", lambda r: r["step_time_s"], "s"),
    ("peak memory per rank", lambda r: max(r["peak_increase_bytes_max"], 1) / 2**20, "MiB"),
]


def time_memory_vs_grid(rows: list[dict[str, Any]], path: Path) -> Path | None:
    return _panels(rows, "num_layers", "points", _TIME_MEMORY, path, "forward+backward vs grid size")


def time_memory_vs_ranks(rows: list[dict[str, Any]], path: Path) -> Path | None:
    return _panels(rows, "grid", "ranks", _TIME_MEMORY, path, "forward+backward vs ranks", with_baseline=True)


def bytes_vs_ranks(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Counted bytes per rank per layer (markers) and the analytic formula (dashed)."""
    rows = [r for r in rows if r["ranks"] > 1]
    if not rows:
        return None
    grids = sorted({r["grid"] for r in rows}, key=lambda g: min(r["points"] for r in rows if r["grid"] == g))
    fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 3.4), squeeze=False)
    line_keys = _varying(rows, {"grid", "ranks", "num_layers"})
    for ax, grid in zip(axes[0], grids):
        lines: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for r in rows:
            if r["grid"] == grid:
                lines[_label(r, line_keys)][r["ranks"]] = r  # bytes per layer do not depend on the layer count
        for label, by_ranks in sorted(lines.items()):
            ranks = sorted(by_ranks)
            pts = [by_ranks[p] for p in ranks]
            counted = [r["bytes_sent_max"] / r["num_layers"] / 2**20 for r in pts]
            analytic = [r["analytic_bytes_max"] / r["num_layers"] / 2**20 for r in pts]
            (line,) = ax.plot(ranks, counted, _MARKERS.get(pts[0]["strategy"], "o"), label=f"{label} counted")
            ax.plot(ranks, analytic, "--", color=line.get_color(), label=f"{label} analytic")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["ranks"] for r in rows}))
        ax.set_xticklabels([str(p) for p in sorted({r["ranks"] for r in rows})])
        ax.set_title(f"grid = {grid}")
        ax.set_xlabel("ranks")
        ax.set_ylabel("sent per rank per layer (MiB)")
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("bytes sent per rank per layer, forward+backward (most loaded rank)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sweep_plots(rows: list[dict[str, Any]], directory: Path) -> list[Path]:
    """Every plot for the measured rows, one set per target; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    ok = [r for r in rows if r.get("status") == "ok"]
    for target in sorted({r["target"] for r in ok}):
        mine = [r for r in ok if r["target"] == target]
        for fn, name in (
            (time_memory_vs_grid, "time_memory_vs_grid"),
            (time_memory_vs_ranks, "time_memory_vs_ranks"),
            (bytes_vs_ranks, "bytes_vs_ranks"),
        ):
            path = fn(mine, directory / f"{target}_{name}.png")
            if path is not None:
                written.append(path)
    return written
