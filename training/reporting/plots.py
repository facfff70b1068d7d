"""Pictures logged at the end of a run: the loss curve, a forecast map and skill by lead time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, LogFormatter, MaxNLocator  # noqa: E402

from processor.geometry import unit_vectors  # noqa: E402

if TYPE_CHECKING:
    from training.skill.scores import SkillTable

DPI = 110
_MARKERS = {"model": "o", "persistence": "s", "climatology": "^", "hourly_climatology": "v", "anomaly_persistence": "D"}
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


MAP_DPI = 100
_MAX_MAP_PX = 30000  # the tallest forecast map (many variables): its resolution is lowered to fit


def _raster(lat: np.ndarray, lon: np.ndarray) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """For any grid (reduced Gaussian, unstructured): the index of the nearest grid point (on the
    sphere) of each cell of a regular latitude-longitude raster about as fine as the grid (90 to
    360 rows, twice as many columns), and the raster's ``imshow`` extent. Each point's value
    fills the cells nearest it: the field as the model sees it, not interpolated."""
    from scipy.spatial import cKDTree

    rows = int(np.clip(round(2 * np.sqrt(len(lat) / 2)), 90, 360))
    west = -180.0 if float(np.min(lon)) < 0 else 0.0
    lat_c = 90 - (np.arange(rows) + 0.5) * 180 / rows
    lon_c = west + (np.arange(2 * rows) + 0.5) * 180 / rows
    glon, glat = np.meshgrid(lon_c, lat_c)
    _, nearest = cKDTree(unit_vectors(lat, lon).reshape(-1, 3)).query(unit_vectors(glat, glon).reshape(-1, 3))
    return nearest.reshape(rows, 2 * rows), (west, west + 360.0, -90.0, 90.0)


def _with_unit(label: str, unit: str | None) -> str:
    return f"{label} [{unit}]" if unit else label


# The forecast map's layout, in inches: a map panel (2:1, longitude by latitude), the gaps beside
# it, a colour bar, room for a colour bar's labels, the margins. Laid out by hand: matplotlib's
# constrained layout takes seconds for a few dozen panels.
_PANEL_W, _PANEL_H, _GAP, _BAR, _BAR_ROOM, _ROW_GAP = 4.4, 2.2, 0.25, 0.14, 1.05, 0.62
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.75, 0.15, 0.75, 0.55


@dataclass(frozen=True)
class _MapRow:
    """One variable's row of the forecast map: what its titles and colour bars say."""

    variable: str
    lead: str  # "+6 h"
    valid: str  # the valid date (ISO)
    unit: str | None
    last: bool  # the bottom row: it labels the longitude axis

    def draw(self, fig: plt.Figure, grid, row: int, truth: np.ndarray, forecast: np.ndarray, show: dict, first):
        """Truth, forecast (one colour scale) and error (its own, symmetric) in row ``row`` of the
        figure's ``grid``, from rasters ``(rows, columns)``; the first axes, which the others share."""
        var, lead, valid = self.variable, self.lead, self.valid
        lo, hi = float(min(truth.min(), forecast.min())), float(max(truth.max(), forecast.max()))
        err = forecast - truth
        elim = float(np.abs(err).max()) or 1.0
        ax_t, ax_f, ax_e = (fig.add_subplot(grid[row, c], sharex=first, sharey=first) for c in (0, 2, 6))
        ax_t.imshow(truth, cmap="viridis", vmin=lo, vmax=hi, **show)
        im = ax_f.imshow(forecast, cmap="viridis", vmin=lo, vmax=hi, **show)
        im_e = ax_e.imshow(err, cmap="RdBu_r", vmin=-elim, vmax=elim, **show)
        ax_t.set_title(f"{var}: truth, valid {valid}", fontsize="medium")
        ax_f.set_title(f"{var}: forecast {lead}, valid {valid}", fontsize="medium")
        rms = float(np.sqrt(np.mean(err**2)))
        ax_e.set_title(f"{var}: forecast \u2212 truth ({lead}), RMS {rms:.3g}", fontsize="medium")
        fig.colorbar(im, cax=fig.add_subplot(grid[row, 4]), label=_with_unit(var, self.unit))
        fig.colorbar(im_e, cax=fig.add_subplot(grid[row, 8]), label=_with_unit(f"{var} error", self.unit))
        for ax in (ax_t, ax_f, ax_e):
            ax.tick_params(labelsize="small", labelbottom=self.last, labelleft=ax is ax_t)
            if self.last:
                ax.set_xlabel("longitude (\u00b0)")
        ax_t.set_ylabel("latitude (\u00b0)")
        return first or ax_t


def forecast_map_figure(
    lat: np.ndarray,
    lon: np.ndarray,
    truth: np.ndarray,
    forecast: np.ndarray,
    variables: list[str],
    lead_hours: float | None = None,
    valid_date: str | None = None,
    units: dict[str, str] | None = None,
    initial_date: str | None = None,
    extra_rows: list[tuple[float, str | None]] | None = None,
) -> plt.Figure:
    """Truth, forecast and their difference of every variable: ``truth`` and ``forecast``
    ``(points, variables)`` in physical units on the grid's points (degrees ``lat``, ``lon``).
    One row per variable; truth and forecast share a colour scale (one colour bar), the error
    has its own, symmetric about 0; each panel's title names the variable, the lead (hours) and
    the valid date (ISO); colour bars carry ``units`` where known. ``extra_rows``: the lead
    (hours) and valid date of each of the last ``len(extra_rows)`` rows, when those are
    another lead than the others' (a tracer further out, say)."""
    truth, forecast = np.asarray(truth, dtype=np.float64), np.asarray(forecast, dtype=np.float64)
    if truth.ndim == 1:
        truth, forecast = truth[:, None], forecast[:, None]
    units = units or {}
    nearest, extent = _raster(np.asarray(lat), np.asarray(lon))
    extra_rows = extra_rows or []
    rows = [(lead_hours, valid_date)] * (len(variables) - len(extra_rows)) + list(extra_rows)
    # columns: truth | gap | forecast | gap | bar | room | error | gap | bar | room
    widths = [_PANEL_W, _GAP, _PANEL_W, 0.08, _BAR, _BAR_ROOM, _PANEL_W, 0.08, _BAR, _BAR_ROOM]
    n = len(variables)
    width = _LEFT + sum(widths) + _RIGHT
    height = _TOP + n * _PANEL_H + (n - 1) * _ROW_GAP + _BOTTOM
    fig = plt.figure(figsize=(width, height))
    grid = fig.add_gridspec(
        n, len(widths), width_ratios=widths, wspace=0, hspace=_ROW_GAP / _PANEL_H,
        left=_LEFT / width, right=1 - _RIGHT / width, top=1 - _TOP / height, bottom=_BOTTOM / height,
    )  # fmt: skip
    show = {"origin": "upper", "extent": extent, "interpolation": "nearest", "aspect": "auto"}
    first = None
    for row, var in enumerate(variables):
        lead = f"+{rows[row][0]:g} h" if rows[row][0] is not None else "lead ?"
        panels = _MapRow(var, lead, rows[row][1] or "?", units.get(var), row == n - 1)
        first = panels.draw(fig, grid, row, truth[:, row][nearest], forecast[:, row][nearest], show, first)
    first.set_xticks(np.arange(extent[0], extent[1] + 1, 60))
    first.set_yticks([-90, -45, 0, 45, 90])
    first.set_xlim(extent[:2])
    first.set_ylim(extent[2:])
    init = f", initialised {initial_date}" if initial_date else ""
    lead, valid = f"+{lead_hours:g} h" if lead_hours is not None else "lead ?", valid_date or "?"
    further = f" (last {len(extra_rows)} rows further out)" if extra_rows else ""
    fig.suptitle(
        f"Forecast {lead}, valid {valid}{init}: truth, forecast and error of each variable{further}",
        y=1 - 0.25 / height, fontsize="large",
    )  # fmt: skip
    return fig


def forecast_map(
    lat: np.ndarray,
    lon: np.ndarray,
    truth: np.ndarray,
    forecast: np.ndarray,
    variables: list[str] | str,
    path: Path,
    lead_hours: float | None = None,
    valid_date: str | None = None,
    units: dict[str, str] | None = None,
    initial_date: str | None = None,
    extra_rows: list[tuple[float, str | None]] | None = None,
) -> Path:
    """:func:`forecast_map_figure` as a PNG at ``path`` (1600 px wide; about 300 px high per
    variable, lower resolution beyond 100 variables)."""
    variables = [variables] if isinstance(variables, str) else list(variables)
    fig = forecast_map_figure(
        lat, lon, truth, forecast, variables, lead_hours, valid_date, units, initial_date, extra_rows
    )
    fig.savefig(path, dpi=min(MAP_DPI, _MAX_MAP_PX / fig.get_figheight()))
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
