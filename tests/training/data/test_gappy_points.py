"""A store with points that have no value (anemoi-datasets' ``build.allow_nans``: the sea of a
land-only product): the reader leaves them out of the grid, and a run trains on the rest,
sharded as on one rank."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tests.training.conftest import small_config
from training.app import run
from training.data import ZarrDataset, write_rossby_haurwitz
from training.data.dataset import DatasetError

ROWS, COLUMNS = 12, 14
SEA_COLUMNS = 4  # the west of every row: no value at any date
STATION = 5 * COLUMNS + 9  # a land point with no value on two dates


def _gappy_store(path, sea_columns: int = SEA_COLUMNS, gaps_at: tuple[int, ...] = (STATION,), allow_nans: bool = True):
    """A 12 x 14 regional box, 24 six-hourly dates, NaN on its western columns at every date and
    at ``gaps_at`` on dates 3 and 10."""
    lats, lons = np.arange(56, 50.4, -0.5), np.arange(-4, 2.6, 0.5)
    store = write_rossby_haurwitz(path, np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360, steps=24, seed=3)
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    sea = (np.arange(ROWS * COLUMNS) % COLUMNS) < sea_columns
    data[..., sea] = np.nan
    for point in gaps_at:
        data[[3, 10], ..., point] = np.nan
    root["data"][:] = data
    root.attrs["allow_nans"] = allow_nans
    return store, np.flatnonzero(~sea & ~np.isin(np.arange(ROWS * COLUMNS), gaps_at))


def test_points_without_values_are_left_out(tmp_path):
    store, kept = _gappy_store(tmp_path / "gappy.zarr")
    dataset = ZarrDataset(store)
    assert dataset.n_points == len(kept) == ROWS * (COLUMNS - SEA_COLUMNS) - 1
    assert dataset.field_shape == (len(kept),)
    raw = zarr.open_group(str(store), mode="r")
    lat, lon = raw["latitudes"][:], raw["longitudes"][:]
    assert sorted(zip(dataset.latitudes, dataset.longitudes)) == sorted(zip(lat[kept], lon[kept]))
    assert dataset.area_weights.mean() == pytest.approx(1.0)
    dataset.check_finite()  # the points left out are not read
    state = dataset.state(10)  # a date the station has no value on
    assert np.isfinite(state).all()
    at = {(a, b): i for i, (a, b) in enumerate(zip(dataset.latitudes, dataset.longitudes))}
    point = kept[7]
    expected = (raw["data"][10, :, 0, point] - dataset.mean) / dataset.stdev
    np.testing.assert_allclose(state[at[(lat[point], lon[point])]], expected, rtol=1e-6)


def test_without_allow_nans_a_nan_is_an_error(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", allow_nans=False)
    dataset = ZarrDataset(store)
    assert dataset.n_points == ROWS * COLUMNS
    with pytest.raises(DatasetError, match="non-finite value nan .* point 0 "):
        dataset.check_finite()


def test_gaps_on_many_points_are_dates_with_no_data(tmp_path):
    gaps = tuple(p for row in (2, 8) for p in range(row * COLUMNS + SEA_COLUMNS, (row + 1) * COLUMNS))  # 2 rows of land
    store, _ = _gappy_store(tmp_path / "gappy.zarr", gaps_at=gaps)
    with pytest.raises(DatasetError, match=r"20 of 168 points .* no value on some dates only: .*missing_dates"):
        ZarrDataset(store)


def test_a_gappy_store_trains_sharded_as_on_one_rank(tmp_path):
    store, kept = _gappy_store(tmp_path / "gappy.zarr")
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
