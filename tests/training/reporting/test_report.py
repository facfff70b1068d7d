"""The forecast map of a run's end: every variable, with its lead and valid date."""

from __future__ import annotations

import matplotlib.image
import numpy as np

import training.reporting.plots as plots
from training.data import ZarrDataset
from training.reporting.report import final_pictures
from training.reporting.tracking import NullTracker


def _sphere(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lat = np.degrees(np.arcsin(rng.uniform(-1, 1, n)))
    return lat, rng.uniform(0, 360, n)


def _rows(fig) -> list[list[str]]:
    """The titles of the map panels (those with an image, not the colour bars), row by row."""
    maps = [ax for ax in fig.axes if ax.images and ax.get_title()]
    rows: dict[float, list] = {}
    for ax in maps:
        rows.setdefault(round(ax.get_position().y0, 4), []).append(ax)
    return [
        [ax.get_title() for ax in sorted(r, key=lambda a: a.get_position().x0)] for _, r in sorted(rows.items())[::-1]
    ]


def test_forecast_map_has_a_row_per_variable_naming_lead_and_valid_date():
    lat, lon = _sphere(800)
    variables = ["psi", "2t", "tracer"]
    truth = np.stack([np.sin(np.radians(lat)) * (i + 1) for i in range(3)], axis=1)
    forecast = truth + 0.1
    fig = plots.forecast_map_figure(
        lat, lon, truth, forecast, variables, lead_hours=6, valid_date="2020-01-09T12:00:00", units={"2t": "K"}
    )
    rows = _rows(fig)
    assert len(rows) == len(variables)
    for var, titles in zip(variables, rows):
        assert len(titles) == 3  # truth, forecast, error
        assert all(t.startswith(f"{var}: ") for t in titles), titles
        assert "truth" in titles[0] and "forecast" in titles[1] and "\u2212 truth" in titles[2]
        assert "2020-01-09T12:00:00" in titles[0] and "2020-01-09T12:00:00" in titles[1]
        assert "+6 h" in titles[1] and "+6 h" in titles[2]
    labels = [ax.get_ylabel() for ax in fig.axes if not ax.get_title()]  # the colour bars
    assert "2t [K]" in labels and "2t error [K]" in labels and "psi" in labels
    assert "+6 h" in fig.get_suptitle() and "2020-01-09T12:00:00" in fig.get_suptitle()
    plots.plt.close(fig)


def test_final_pictures_map_every_variable_of_the_dataset(tmp_path, small_dataset, monkeypatch):
    figures = []
    draw = plots.forecast_map_figure
    monkeypatch.setattr(plots, "forecast_map_figure", lambda *a, **k: figures.append(draw(*a, **k)) or figures[-1])
    dataset = ZarrDataset(small_dataset)
    t = 33
    truth = dataset.state(t + 1)
    final_pictures(NullTracker(), tmp_path, dataset, np.stack([truth, truth * 0.9]), sample=(t, 0), lead=1)
    rows = _rows(figures[0])
    assert [titles[0].split(":")[0] for titles in rows] == dataset.variables
    assert all(dataset.date(t + 1) in titles[1] and "+6 h" in titles[1] for titles in rows)
    assert f"initialised {dataset.date(t)}" in figures[0].get_suptitle()
    width = matplotlib.image.imread(tmp_path / "forecast_map.png").shape[1]
    assert width >= 1400  # about 100 dpi: legible at its size
