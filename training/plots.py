"""Pictures logged at the end of a run: the loss curve and a forecast map."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def loss_curve(history: list[tuple[int, dict[str, float]]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("train/loss", "-"), ("val/loss", "o-")):
        pts = [(s, m[key]) for s, m in history if key in m]
        if pts:
            ax.plot(*zip(*pts), style, label=key, markersize=3)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("MSE (normalised)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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
