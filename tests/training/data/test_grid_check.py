"""The data grid: inferred from the store when ``data.grid`` is null, checked by coordinates when given."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from processor.grids import get_grid
from tests.training.conftest import small_config
from training.app import prepare
from training.data import DatasetError
from training.data.grid_check import check_grid, infer_grid


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
    with pytest.raises(DatasetError, match=r"^data.grid = null: the grid of x \(1600 points, resolution 'O16'\)"):
        infer_grid(g.latitudes, g.longitudes + 3.0, "O16", "x")
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
