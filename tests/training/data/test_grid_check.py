"""The data grid: inferred from the store when ``data.grid`` is null, checked by coordinates when given."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from processor.grids import get_grid
from processor.point_sets import point_set
from tests.training.conftest import small_config
from training.data import DatasetError
from training.data.grid_check import check_grid as _check_grid
from training.data.grid_check import infer_grid as _infer_grid
from training.launch.launcher import prepare


def infer_grid(lat, lon, resolution, where):
    return _infer_grid(point_set(lat, lon), lat, lon, resolution)


def check_grid(lat, lon, name, where):
    _check_grid(point_set(lat, lon), lat, lon, name, where)


@pytest.mark.parametrize("name", ["o16", "o32", "f8"])
def test_inferred_from_coordinates(name):
    g = get_grid(name)
    assert infer_grid(g.latitudes, g.longitudes, None, "x") == name
    assert infer_grid(g.latitudes, g.longitudes, name.upper(), "x") == name  # anemoi writes "O32"


def test_longitudes_modulo_360_and_another_point_order_are_the_same_grid():
    g = get_grid("o16")
    lon = np.where(g.longitudes >= 180, g.longitudes - 360, g.longitudes)  # [-180, 180)
    check_grid(g.latitudes, lon, "o16", "x")
    order = np.random.default_rng(0).permutation(g.n_points)
    check_grid(g.latitudes[order], g.longitudes[order], "o16", "x")
    assert infer_grid(g.latitudes[order], lon[order], None, "x") == "o16"


def test_same_point_count_other_coordinates_is_refused():
    g = get_grid("o16")
    with pytest.raises(DatasetError, match=r"^data.grid = o16 does not fit x: its coordinates are not those of o16"):
        check_grid(g.latitudes, g.longitudes + 3.0, "o16", "x")
    # Rings that do not start at longitude 0 are no oN: a reduced Gaussian grid, named so.
    assert infer_grid(g.latitudes, g.longitudes + 3.0, "O16", "x") == "n16"
    with pytest.raises(DatasetError, match=r"^data.grid = o32 has 5248 points but x has 1600"):
        check_grid(g.latitudes, g.longitudes, "o32", "x")


def test_shifted_store_fails_in_prepare_naming_data_grid(tmp_path, small_dataset):
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    root = zarr.open_group(str(store), mode="a")
    root["longitudes"][:] = root["longitudes"][:] + 2.0
    with pytest.raises(DatasetError, match="data.grid = o16 does not fit .*store.zarr: its coordinates"):
        prepare(small_config(tmp_path / "run", store))


def test_null_grid_is_inferred_and_recorded(tmp_path, small_dataset):
    resolved = prepare(small_config(tmp_path / "run", small_dataset, "data.grid=null"))
    assert resolved.data.grid == "o16"


def _reduced_gaussian(n: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Rings at the 2N Gaussian latitudes, about 4N cos(latitude) points each, ``total`` in all."""
    from processor.grids import gaussian_latitudes

    lats, _ = gaussian_latitudes(n)
    counts = np.maximum(20, np.round(4 * n * np.cos(np.radians(lats)))).astype(int)
    counts[n - 1] += total - counts.sum()  # the ring nearest the equator takes the difference
    lon = np.concatenate([np.arange(c) * 360.0 / c for c in counts])
    return np.repeat(lats, counts), lon


def test_an_ecmwf_reduced_grid_is_read_from_its_rings():
    lat, lon = _reduced_gaussian(320, 542080)
    assert infer_grid(lat, lon, None, "x") == "n320"
    check_grid(lat, lon, "n320", "x")
    lat80, lon80 = _reduced_gaussian(80, 35718)
    assert infer_grid(lat80, lon80, "N80", "x") == "n80"
    with pytest.raises(DatasetError, match=r"^data.grid = n80 does not fit x: its rings are those of"):
        check_grid(lat80[::-1], lon80 + 0.5 * (lat80 > 0), "n80", "x")


def test_any_grid_is_named_and_a_wrong_name_refused_in_one_line():
    lats, lons = np.arange(60, 39.99, -0.25), np.arange(-10, 10.001, 0.25)
    lat, lon = np.repeat(lats, len(lons)), np.tile(lons, len(lats))
    name = infer_grid(lat, lon, None, "x")
    assert name == "regional lat-lon 81 x 81 at 0.25 degrees"
    check_grid(lat, lon, name, "x")  # a resumed run's record
    with pytest.raises(DatasetError, match=r"^data.grid = 'regional lat-lon 81 x 81 at 0.5 degrees' does not fit x"):
        check_grid(lat, lon, "regional lat-lon 81 x 81 at 0.5 degrees", "x")
