"""What a store holds beyond the per-point regression (training/skill/headroom.py,
``python -m training.headroom``): a store whose weather moves from point to point, which no
per-point regression can forecast and the field forecasts do; one rank only. The dual fits
themselves: tests/training/model/test_dual_ridge.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from training.data.anemoi_layout import write_anemoi_store
from training.headroom import run


def _moving_weather_store(path):
    """A 3 x 4 box, 6-hourly for 75 days: each date's values are the last date's moved one point
    along (a new random value enters at the first point). A point's own past says nothing of its
    next value; its neighbour's last value says everything."""
    rng = np.random.default_rng(2)
    dates = np.arange("2021-01-01T00", "2021-03-17T00", 6, dtype="datetime64[h]")
    values = np.zeros((len(dates), 12))
    values[0] = rng.normal(size=12)
    for t in range(1, len(dates)):
        values[t, 1:], values[t, 0] = values[t - 1, :-1], rng.normal()
    lat, lon = np.repeat([50.0, 49.0, 48.0], 4), np.tile([0.0, 1.0, 2.0, 3.0], 3)
    return write_anemoi_store(path, 280 + values[:, None, None, :], dates, ["2t"], lat, lon, "1.0")


def test_the_field_forecasts_see_what_moves_between_points(tmp_path):
    store = _moving_weather_store(tmp_path / "moving.zarr")
    overrides = [f"run_dir={tmp_path / 'run'}", "data=zarr", f"data.path={store}", "evaluate.steps=1"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        text = run(compose(config_name="config", overrides=overrides))
    row = next(line for line in text.splitlines() if line.startswith("| 2t |"))
    persistence, regression, ridge, kernel = (float(c) for c in row.split("|")[2:6])
    # The neighbour's value, found: all but the first point's new value (a twelfth of the area).
    assert ridge < 0.5 * regression and kernel < 0.8 * regression
    assert regression > 0.6 * persistence  # what no regression of a point's own past can do
    assert (tmp_path / "run" / "headroom.md").read_text().count("| 2t |") == 1
    logged = json.loads((tmp_path / "run" / "evaluations.jsonl").read_text().splitlines()[-1])
    assert logged["eval/rmse/2t/field_ridge/006h"] == pytest.approx(ridge, rel=1e-3)  # as MLflow has it


def test_too_few_training_samples_are_refused(tmp_path):
    store = _moving_weather_store(tmp_path / "moving.zarr")
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "data=zarr",
        f"data.path={store}",
        "data.val_fraction=0.9",
        "evaluate.steps=12",
    ]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        with pytest.raises(ValueError, match="training samples have targets that many leads on; python -m training"):
            run(compose(config_name="config", overrides=overrides))


def test_more_than_one_rank_is_refused(tmp_path):
    store = _moving_weather_store(tmp_path / "moving.zarr")
    overrides = [f"run_dir={tmp_path / 'run'}", "data=zarr", f"data.path={store}", "trainer.nprocs=2"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        with pytest.raises(ValueError, match="trainer.nprocs = 2: python -m training.headroom runs on one rank"):
            run(compose(config_name="config", overrides=overrides))
