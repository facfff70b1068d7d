"""Pictures logged at the end of a run: the loss curve, a forecast map and skill by lead time."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, LogFormatter, MaxNLocator  # noqa: E402

from training.reporting.map_frame import MapFrame, map_frame, raster  # noqa: E402
from training.skill.calibration import UNCALIBRATED  # noqa: E402

if TYPE_CHECKING:
    from training.skill.scores import SkillTable

DPI = 110
# Each forecast kind's (colour, marker), the same in every panel: the model and the baselines.
KIND_STYLES = {
    "model": ("tab:blue", "o"),
    UNCALIBRATED: ("lightsteelblue", "o"),
    "persistence": ("tab:orange", "s"),
    "climatology": ("tab:green", "^"),
    "hourly_climatology": ("tab:red", "v"),
    "doy_climatology": ("tab:brown", "P"),
    "anomaly_persistence": ("tab:purple", "D"),
    "damped_persistence": ("tab:olive", "<"),
    "linear_regression": ("tab:cyan", ">"),
}
_OTHER_COLOURS = ("tab:pink", "tab:gray", "black", "gold", "navy")
_OTHER_MARKERS = ("X", "*", "h", "p", "d")


class _PlainLogFormatter(LogFormatter):
    """Labels the ticks :class:`LogFormatter` would label, as plain numbers (0.15, 2, 1e-05)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:.6g}" if super().__call__(x, pos) else ""


def _plain_log_ticks(ax: plt.Axes) -> None:
    """Log-scale y ticks written as plain numbers, not 1.5x10^-1; minor ticks labelled too
    when the axis spans at most two decades."""
    ax.yaxis.set_major_formatter(_PlainLogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _horizon(steps: list[float], varied: str) -> str:
    """A loss's forecast steps for its legend, from each plotted record's (``train/rollout`` or
    ``val/rollout``, 1 where absent); ``varied`` says why they differ. The two curves of a
    rollout run are over different horizons while the rollout is raised, so their gap is not
    all over-fitting."""
    low, high = int(min(steps)), int(max(steps))
    if low == high:
        return f" ({low} forecast step{'s' if low > 1 else ''})"
    return f" ({low} to {high} forecast steps, {varied})"


def loss_curve(history: list[tuple[int, dict[str, float]]], path: Path) -> Path:
    """Train and validation loss (log scale) against the step, each curve's forecast steps in the
    legend; a PNG 1100 px wide at ``path``."""
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    train = [(s, m["train/loss"]) for s, m in history if "train/loss" in m]
    val = [(s, m["val/loss"]) for s, m in history if "val/loss" in m]
    if train:
        steps = [m.get("train/rollout", 1.0) for _, m in history if "train/loss" in m]
        label = "train/loss" + _horizon(steps, "raised during the run")
        ax.plot(*zip(*train), "-", color="tab:blue", lw=1.2, alpha=0.8, label=label, zorder=2)
    if val:
        ax.plot(
            *zip(*val), "o--", color="tab:orange", lw=1.2, markersize=7, markeredgecolor="black",
            label="val/loss" + _horizon([m.get("val/rollout", 1.0) for _, m in history if "val/loss" in m], "by run"),
            zorder=3,
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


def _with_unit(label: str, unit: str | None) -> str:
    return f"{label} [{unit}]" if unit else label


# The forecast map's layout, in inches: a map panel (4.4 wide, as high as the domain's shape asks:
# 2.2 for the globe), the gaps beside it, a colour bar, room for a colour bar's labels, the
# margins. Laid out by hand: matplotlib's constrained layout takes seconds for a few dozen panels.
_PANEL_W, _GAP, _BAR, _BAR_ROOM, _ROW_GAP = 4.4, 0.25, 0.14, 1.05, 0.62
_PANEL_H_RANGE = (1.2, 6.0)  # a panel's height, whatever the domain's shape
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.75, 0.15, 0.75, 0.55
_WIDTHS = [_PANEL_W, _GAP, _PANEL_W, 0.08, _BAR, _BAR_ROOM, _PANEL_W, 0.08, _BAR, _BAR_ROOM]
# columns: truth | gap | forecast | gap | bar | room | error | gap | bar | room
LON_LABEL, LAT_LABEL = "longitude (degrees east)", "latitude (degrees north)"


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
        figure's ``grid``, from rasters ``(rows, columns)`` (NaN: no grid point); the first axes,
        which the others share."""
        var, lead, valid = self.variable, self.lead, self.valid
        lo, hi = float(min(np.nanmin(truth), np.nanmin(forecast))), float(max(np.nanmax(truth), np.nanmax(forecast)))
        err = forecast - truth
        elim = float(np.nanmax(np.abs(err))) or 1.0
        ax_t = fig.add_subplot(grid[row, 0], sharex=first, sharey=first)
        share = first or ax_t
        ax_f, ax_e = (fig.add_subplot(grid[row, c], sharex=share, sharey=share) for c in (2, 6))
        ax_t.imshow(truth, cmap="viridis", vmin=lo, vmax=hi, **show)
        im = ax_f.imshow(forecast, cmap="viridis", vmin=lo, vmax=hi, **show)
        im_e = ax_e.imshow(err, cmap="RdBu_r", vmin=-elim, vmax=elim, **show)
        ax_t.set_title(f"{var}: truth, valid {valid}", fontsize="medium")
        ax_f.set_title(f"{var}: forecast {lead}, valid {valid}", fontsize="medium")
        rms = float(np.sqrt(np.nanmean(err**2)))
        ax_e.set_title(f"{var}: forecast \u2212 truth ({lead}), RMS {rms:.3g}", fontsize="medium")
        fig.colorbar(im, cax=fig.add_subplot(grid[row, 4]), label=_with_unit(var, self.unit))
        fig.colorbar(im_e, cax=fig.add_subplot(grid[row, 8]), label=_with_unit(f"{var} error", self.unit))
        for ax in (ax_t, ax_f, ax_e):
            ax.tick_params(labelsize="small", labelbottom=self.last, labelleft=ax is ax_t)
            if self.last:
                ax.set_xlabel(LON_LABEL)
        ax_t.set_ylabel(LAT_LABEL)
        return first or ax_t


def _map_grid(frame: MapFrame, n: int) -> tuple[plt.Figure, object]:
    """The figure and its grid of ``n`` map rows, each panel as high as ``frame``'s shape asks
    (within :data:`_PANEL_H_RANGE`; a map of another shape keeps its aspect inside its panel)."""
    panel_h = float(np.clip(_PANEL_W * frame.height_over_width(), *_PANEL_H_RANGE))
    width = _LEFT + sum(_WIDTHS) + _RIGHT
    height = _TOP + n * panel_h + (n - 1) * _ROW_GAP + _BOTTOM
    fig = plt.figure(figsize=(width, height))
    grid = fig.add_gridspec(
        n, len(_WIDTHS), width_ratios=_WIDTHS, wspace=0, hspace=_ROW_GAP / panel_h,
        left=_LEFT / width, right=1 - _RIGHT / width, top=1 - _TOP / height, bottom=_BOTTOM / height,
    )  # fmt: skip
    return fig, grid


def _frame_axes(ax: plt.Axes, frame: MapFrame) -> None:
    """Limits (``frame``'s extent) and ticks of the map axes ``ax`` (which the others share):
    every 60 degrees of longitude and 45 of latitude on the globe; on a box, round ones (as
    matplotlib's), no longitude by the box's edges, where the next panel's would run into it."""
    if not frame.regional:
        ax.set_xticks(np.arange(frame.west, frame.east + 1, 60))
        ax.set_yticks([-90, -45, 0, 45, 90])
    else:
        ticks = MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(frame.west, frame.east)
        margin = 0.04 * (frame.east - frame.west)
        ax.xaxis.set_major_locator(FixedLocator([t for t in ticks if frame.west + margin <= t <= frame.east - margin]))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    ax.set_xlim(frame.extent[:2])
    ax.set_ylim(frame.extent[2:])


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
    ``(points, variables)`` in physical units on the grid's points (degrees ``lat``, ``lon``
    ``(points,)``). The globe for a global grid; for a regional one, its box and its cells, on
    axes that keep distances (:func:`training.reporting.map_frame.map_frame`).
    One row per variable; truth and forecast share a colour scale (one colour bar), the error
    has its own, symmetric about 0; each panel's title names the variable, the lead (hours) and
    the valid date (ISO); colour bars carry ``units`` where known. ``extra_rows``: the lead
    (hours) and valid date of each of the last ``len(extra_rows)`` rows, when those are
    another lead than the others' (a tracer further out, say)."""
    truth, forecast = np.asarray(truth, dtype=np.float64), np.asarray(forecast, dtype=np.float64)
    if truth.ndim == 1:
        truth, forecast = truth[:, None], forecast[:, None]
    units = units or {}
    frame = map_frame(lat, lon)
    nearest = raster(np.asarray(lat), np.asarray(lon), frame)
    extra_rows = extra_rows or []
    rows = [(lead_hours, valid_date)] * (len(variables) - len(extra_rows)) + list(extra_rows)
    n = len(variables)
    fig, grid = _map_grid(frame, n)
    show = {"origin": "upper", "extent": frame.extent, "interpolation": "nearest", "aspect": frame.aspect}
    first = None
    for row, var in enumerate(variables):
        lead = f"+{rows[row][0]:g} h" if rows[row][0] is not None else "lead ?"
        panels = _MapRow(var, lead, rows[row][1] or "?", units.get(var), row == n - 1)
        t, f = (np.where(nearest >= 0, x[:, row][nearest], np.nan) for x in (truth, forecast))
        first = panels.draw(fig, grid, row, t, f, show, first)
    _frame_axes(first, frame)
    init = f", initialised {initial_date}" if initial_date else ""
    lead, valid = f"+{lead_hours:g} h" if lead_hours is not None else "lead ?", valid_date or "?"
    further = f" (last {len(extra_rows)} rows further out)" if extra_rows else ""
    fig.suptitle(
        f"Forecast {lead}, valid {valid}{init}: truth, forecast and error of each variable{further}",
        y=1 - 0.25 / fig.get_figheight(), fontsize="large",
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


def kind_style(kind: str) -> tuple[str, str]:
    """``(colour, marker)`` of a forecast kind's line, the same in every panel and every plot:
    fixed for the kinds scores know (:data:`KIND_STYLES`), else picked by a hash of the name."""
    if kind in KIND_STYLES:
        return KIND_STYLES[kind]
    h = zlib.crc32(kind.encode())
    return _OTHER_COLOURS[h % len(_OTHER_COLOURS)], _OTHER_MARKERS[(h // len(_OTHER_COLOURS)) % len(_OTHER_MARKERS)]


def rmse_by_lead(table: SkillTable, path: Path, units: dict[str, str] | None = None) -> Path:
    """RMSE (physical units, top row) and uncentred ACC (bottom row) against lead time (hours),
    one column per variable, one line per kind (model, persistence, climatologies), each kind
    in its own colour and marker (:func:`kind_style`) in every panel; ``units``: each
    variable's unit, on its RMSE axis, where known. A PNG at least 1100 px wide at ``path``."""
    fig = rmse_by_lead_figure(table, units)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def rmse_by_lead_figure(table: SkillTable, units: dict[str, str] | None = None) -> plt.Figure:
    """:func:`rmse_by_lead`'s figure: axes ``(2, variables)``, RMSE above ACC."""
    variables, leads, kinds = table.variables, table.lead_hours, table.kinds
    units = units or {}
    fig, axes = plt.subplots(
        2, len(variables), figsize=(max(10.0, 4.2 * len(variables)), 7.5), squeeze=False, layout="constrained"
    )
    for col, var in enumerate(variables):
        top, bottom = axes[0, col], axes[1, col]
        for kind in kinds:
            colour, marker = kind_style(kind)
            style = {"color": colour, "marker": marker, "markersize": 6, "label": kind}
            top.plot(leads, table.rmse(kind, var), "-", **style)
            acc = table.acc(kind, var)
            if np.isfinite(acc).any():
                bottom.plot(leads, acc, "-", **style)
        top.set_title(f"{var}: RMSE")
        top.set_ylabel(
            _with_unit(f"RMSE of {var}", units[var]) if units.get(var) else f"RMSE of {var} (physical units)"
        )
        bottom.set_title(f"{var}: ACC (uncentred)")
        bottom.set_ylabel("ACC")
        bottom.set_xlabel("lead time (hours)")
        for ax in (top, bottom):
            if len(leads) <= 12:
                ax.xaxis.set_major_locator(FixedLocator(leads))
            ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    # One legend for every panel (a kind has one style everywhere): a legend per panel cost
    # most of the figure's drawing time (1.2 of 2 s with 5 variables) and said the same ten times.
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize="small")
    fig.suptitle("Forecast skill by lead time (area-weighted, averaged over samples)")
    return fig
