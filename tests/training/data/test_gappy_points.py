"""A store with points that have no value (anemoi-datasets' ``build.allow_nans``: the sea of a
land-only product, a station's gaps): the reader leaves the sea out of the grid and reads a
station's gaps as missing dates, and a run trains on the rest, sharded as on one rank."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tests.training.conftest import small_config
from training.app import run
from training.data import ZarrDataset, write_rossby_haurwitz
from training.data.dataset import DatasetError

ROWS, COLUMNS, DATES = 12, 14, 24
SEA_COLUMNS = 4  # the west of every row: no value at any date
STATION = 5 * COLUMNS + 9  # a land point with no value on dates 3 and 10
LAND = ROWS * (COLUMNS - SEA_COLUMNS)


def _gappy_store(path, gaps: dict[int, list[int]], allow_nans: bool = True, sea_columns: int = SEA_COLUMNS):
    """A 12 x 14 regional box, 24 six-hourly dates, NaN on its western columns at every date and
    at each point of ``gaps`` on its dates."""
    lats, lons = np.arange(56, 50.4, -0.5), np.arange(-4, 2.6, 0.5)
    store = write_rossby_haurwitz(path, np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360, steps=DATES, seed=3)
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    sea = (np.arange(ROWS * COLUMNS) % COLUMNS) < sea_columns
    data[..., sea] = np.nan
    for point, dates in gaps.items():
        data[dates, ..., point] = np.nan
    root["data"][:] = data
    root.attrs["allow_nans"] = allow_nans
    return store, np.flatnonzero(~sea)


def test_the_sea_is_left_out_and_a_stations_gaps_are_missing_dates(tmp_path):
    store, land = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    dataset = ZarrDataset(store)
    assert dataset.n_points == len(land) == LAND and dataset.field_shape == (LAND,)
    assert dataset.missing == {3, 10}
    raw = zarr.open_group(str(store), mode="r")
    lat, lon = raw["latitudes"][:], raw["longitudes"][:]
    assert sorted(zip(dataset.latitudes, dataset.longitudes)) == sorted(zip(lat[land], lon[land]))
    assert dataset.area_weights.mean() == pytest.approx(1.0)
    dataset.check_finite()  # neither the sea nor the gaps are read
    with pytest.raises(DatasetError, match="missing date"):
        dataset.state(10)
    at = {(a, b): i for i, (a, b) in enumerate(zip(dataset.latitudes, dataset.longitudes))}
    state = dataset.state(11)
    expected = (raw["data"][11, :, 0, STATION] - dataset.mean) / dataset.stdev
    np.testing.assert_allclose(state[at[(lat[STATION], lon[STATION])]], expected, rtol=1e-6)


def test_the_gappiest_stations_are_left_out_when_their_gaps_would_cost_too_many_dates(tmp_path):
    other = STATION + 2 * COLUMNS
    store, land = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10], other: list(range(5, 13))})
    dataset = ZarrDataset(store)
    assert dataset.missing == {3, 10} and dataset.n_points == LAND - 1  # 8 of 24 dates: over 10%
    assert (dataset.latitudes == zarr.open_group(str(store), mode="r")["latitudes"][other]).sum() == COLUMNS - 5


def test_without_allow_nans_a_nan_is_an_error(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]}, allow_nans=False)
    dataset = ZarrDataset(store)
    assert dataset.n_points == ROWS * COLUMNS and not dataset.missing
    with pytest.raises(DatasetError, match="non-finite value nan .* point 0 "):
        dataset.check_finite()


def test_a_store_with_next_to_no_values_is_refused(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {}, sea_columns=COLUMNS)
    with pytest.raises(DatasetError, match=r"only 0 of 168 points have values to train on"):
        ZarrDataset(store)


def test_a_gappy_store_trains_sharded_as_on_one_rank(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    settings = ["data.grid=null", "trainer.steps=2", "trainer.val_interval=2", "data.val_fraction=0.25"]
    settings += ["model.hidden_grid=data", "evaluate.at_end_of_training=false", "logging.mlflow=false"]
    sharded = run(small_config(tmp_path / "sharded", store, *settings, "trainer.nprocs=3", "trainer.ranks_per_model=3"))
    single = run(
        small_config(
            tmp_path / "single", store, *settings, "strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"
        )
    )
    losses = [np.array([m["train/loss"] for _, m in result["history"]]) for result in (sharded, single)]
    assert len(losses[0]) == 2 and np.isfinite(losses[0]).all()
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
