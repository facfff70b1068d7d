"""Pictures logged at the end of a run: the loss curve, a forecast map and skill by lead time."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, LogFormatter, MaxNLocator  # noqa: E402

if TYPE_CHECKING:
    from training.skill import SkillTable

DPI = 110
_MARKERS = {"model": "o", "persistence": "s", "climatology": "^"}
_OTHER_MARKERS = ("D", "v", "P", "X", "*")


class _PlainLogFormatter(LogFormatter):
    """Labels the ticks :class:`LogFormatter` would label, as plain numbers (0.15, 2, 1e-05)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:.6g}" if super().__call__(x, pos) else ""


def _plain_log_ticks(ax: plt.Axes) -> None:
    """Log-scale y ticks written as plain numbers, not 1.5x10^-1; minor ticks labelled too
    when the axis spans at most two decades."""
    ax.yaxis.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def loss_curve(history: list[tuple[int, dict[str, float]]], path: Path) -> Path:
    """Train and validation loss (log scale) against the step; a PNG 1100 px wide at ``path``."""
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    train = [(s, m["train/loss"]) for s, m in history if "train/loss" in m]
    val = [(s, m["val/loss"]) for s, m in history if "val/loss" in m]
    if train:
        ax.plot(*zip(*train), "-", color="tab:blue", lw=1.2, alpha=0.8, label="train/loss", zorder=2)
    if val:
        ax.plot(
            *zip(*val), "o--", color="tab:orange", lw=1.2, markersize=7, markeredgecolor="black",
            label="val/loss", zorder=3,
        )  # fmt: skip
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("MSE (normalised units)")
    ax.set_title("Loss")
    if train or val:
        ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def forecast_map(
    lat: np.ndarray, lon: np.ndarray, truth: np.ndarray, forecast: np.ndarray, name: str, path: Path
) -> Path:
    """Truth, forecast and error of one field on the grid's points, ``(points,)`` each."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    vmin, vmax = float(truth.min()), float(truth.max())
    err = forecast - truth
    elim = float(np.abs(err).max()) or 1.0
    panels = [
        ("truth", truth, "viridis", vmin, vmax),
        ("forecast", forecast, "viridis", vmin, vmax),
        ("forecast - truth", err, "RdBu_r", -elim, elim),
    ]
    for ax, (title, values, cmap, lo, hi) in zip(axes, panels):
        sc = ax.scatter(lon, lat, c=values, s=4, cmap=cmap, vmin=lo, vmax=hi)
        ax.set_title(f"{name}: {title}")
        ax.set_xlabel("longitude")
        fig.colorbar(sc, ax=ax, shrink=0.8)
    axes[0].set_ylabel("latitude")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _marker(kind: str, i: int) -> str:
    return _MARKERS.get(kind, _OTHER_MARKERS[i % len(_OTHER_MARKERS)])


def rmse_by_lead(table: SkillTable, path: Path) -> Path:
    """RMSE (physical units, top row) and uncentred ACC (bottom row) against lead time (hours),
    one column per variable, one line per kind (model, persistence, climatology); a PNG at least
    1100 px wide at ``path``."""
    variables, leads, kinds = table.variables, table.lead_hours, table.kinds
    fig, axes = plt.subplots(
        2, len(variables), figsize=(max(10.0, 4.2 * len(variables)), 7.5), squeeze=False, layout="constrained"
    )
    for col, var in enumerate(variables):
        top, bottom = axes[0, col], axes[1, col]
        for i, kind in enumerate(kinds):
            style = {"marker": _marker(kind, i), "markersize": 6, "label": kind}
            top.plot(leads, table.rmse(kind, var), "-", **style)
            acc = table.acc(kind, var)
            if np.isfinite(acc).any():
                bottom.plot(leads, acc, "-", **style)
        top.set_title(f"{var}: RMSE")
        top.set_ylabel(f"RMSE of {var} (physical units)")
        bottom.set_title(f"{var}: ACC (uncentred)")
        bottom.set_ylabel("ACC")
        bottom.set_xlabel("lead time (hours)")
        for ax in (top, bottom):
            if len(leads) <= 12:
                ax.xaxis.set_major_locator(FixedLocator(leads))
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize="small")
    fig.suptitle("Forecast skill by lead time (area-weighted, averaged over samples)")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
