"""A store with points that have no value (anemoi-datasets' ``build.allow_nans``: the sea of a
land-only product, a station's gaps): the reader leaves the sea out of the grid, weighs the land
by its cells, and reads a station's gaps as missing dates; a run trains on the rest, sharded as
on one rank (the same loss: the ranks' blocks of the kept points join up)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from tests.training.conftest import small_config, train_sharded_and_single
from training import predict
from training.data import ZarrDataset, write_rossby_haurwitz
from training.data.dataset import DatasetError
from training.data.read_plan import load_plan

ROWS, COLUMNS, DATES = 12, 14, 24
SEA_COLUMNS = 4  # the west of every row, and 3 more in the northern 3: no value at any date
STATION = 5 * COLUMNS + 9  # a land point with no value on dates 3 and 10
LAND = ROWS * (COLUMNS - SEA_COLUMNS) - 3 * 3


def _gappy_store(path, gaps: dict[int, list[int]], allow_nans: bool = True, sea_columns: int = SEA_COLUMNS):
    """A 12 x 14 regional box, 24 six-hourly dates, NaN on its western columns (wider in the north)
    at every date and at each point of ``gaps`` on its dates."""
    lats, lons = np.arange(56, 50.4, -0.5), np.arange(-4, 2.6, 0.5)
    store = write_rossby_haurwitz(path, np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360, steps=DATES, seed=3)
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    row, column = np.divmod(np.arange(ROWS * COLUMNS), COLUMNS)
    sea = (column < sea_columns) | ((row < 3) & (column < sea_columns + 3) & (sea_columns > 0))  # no box left
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
    cells = np.cos(np.radians(dataset.latitudes))  # the box's cells, not the triangles of the land left
    np.testing.assert_allclose(dataset.area_weights, cells / cells.mean(), rtol=1e-3)
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


def test_gaps_alone_keep_every_point_and_an_inf_is_still_an_error(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]}, sea_columns=0)
    dataset = ZarrDataset(store)
    assert dataset.n_points == ROWS * COLUMNS and dataset.missing == {3, 10}
    dataset.check_finite()
    zarr.open_group(str(store), mode="a")["data"][7, 0, 0, 5] = np.inf  # allow_nans allows NaN, not inf
    with pytest.raises(DatasetError, match=r"non-finite value inf .* \(index 7\), point 5 "):
        ZarrDataset(store).check_finite()


def test_without_allow_nans_a_nan_is_an_error(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]}, allow_nans=False)
    dataset = ZarrDataset(store)
    assert dataset.n_points == ROWS * COLUMNS and not dataset.missing
    with pytest.raises(DatasetError, match="non-finite value nan .* point 0 "):
        dataset.check_finite()


def _store_with_a_partial_field(path, lacking_columns: int):
    """The box with every value, but its ``u`` (the third of five variables) without one on the
    ``lacking_columns`` western columns: a field over part of the grid (an SST over land)."""
    store, _ = _gappy_store(path, {}, sea_columns=0)
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    data[:, 2, :, np.arange(ROWS * COLUMNS) % COLUMNS < lacking_columns] = np.nan
    root["data"][:] = data
    return store


def test_a_field_over_part_of_the_grid_is_left_out_not_the_points(tmp_path):
    store = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)  # 48 of 168 points
    dataset = ZarrDataset(store)
    assert dataset.variables == ["psi", "zeta", "v", "tracer"] and dataset.n_points == ROWS * COLUMNS
    dataset.check_finite()
    root = zarr.open_group(str(store), mode="r")
    at = {(a, b): i for i, (a, b) in enumerate(zip(root["latitudes"][:], root["longitudes"][:]))}
    order = [at[(a, b)] for a, b in zip(dataset.latitudes, dataset.longitudes)]  # processor -> store order
    raw = np.asarray(root["data"][5])[[0, 1, 3, 4], 0][:, order]  # (variables, points): u left out
    np.testing.assert_allclose(dataset.denormalise(dataset.state(5)), raw.T, rtol=1e-5)
    named = ZarrDataset(store, variables=["psi", "u"])  # asked for: its points go instead
    assert named.variables == ["psi", "u"] and named.n_points == ROWS * (COLUMNS - 4)
    as_input = ZarrDataset(store, forcing=["u"])
    assert "u" in as_input.variables and as_input.n_points == ROWS * (COLUMNS - 4)


def test_a_field_without_any_value_and_so_without_statistics_is_left_out_not_refused(tmp_path):
    """anemoi-datasets leaves such a field's mean and stdev NaN: it goes, as any partial field."""
    store = _store_with_a_partial_field(tmp_path / "empty.zarr", lacking_columns=COLUMNS)
    root = zarr.open_group(str(store), mode="a")
    for name in ("mean", "stdev"):
        values = root[name][:]
        values[2] = np.nan
        root[name][:] = values
    dataset = ZarrDataset(store)
    assert dataset.variables == ["psi", "zeta", "v", "tracer"] and dataset.n_points == ROWS * COLUMNS


def test_a_field_lacking_a_few_points_keeps_its_place_and_they_are_left_out(tmp_path):
    store = _store_with_a_partial_field(tmp_path / "coast.zarr", lacking_columns=1)  # 12 of 168: under 10%
    dataset = ZarrDataset(store)
    assert "u" in dataset.variables and dataset.n_points == ROWS * (COLUMNS - 1)


@pytest.mark.parametrize("constant", [True, False])
def test_a_land_store_with_a_field_valued_everywhere_keeps_its_land_variables(tmp_path, constant):
    """A land-only product with a land-sea mask over the whole grid (one of anemoi's constant
    fields, or not listed as one): the sea is left out, not the land's variables."""
    store, land = _gappy_store(tmp_path / "land.zarr", {})
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    data[:, 4] = np.where(np.isin(np.arange(ROWS * COLUMNS), land), 1.0, 0.0)  # "tracer": a mask
    root["data"][:] = data
    if constant:
        root.attrs["constant_fields"] = ["tracer"]
    dataset = ZarrDataset(store)
    assert dataset.variables == ["psi", "zeta", "u", "v", "tracer"] and dataset.n_points == LAND
    assert ("tracer" in dataset.roles.forcing) == constant


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # anemoi-utils' settings
def test_through_open_dataset_the_nans_are_read_around_as_in_the_store(tmp_path):
    pytest.importorskip("anemoi.datasets")
    from training.data.anemoi_source import AnemoiDataset

    gappy, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    partial = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)
    for store in (gappy, partial):
        direct, through = ZarrDataset(store), AnemoiDataset({"dataset": str(store), "start": 2020})
        assert (through.variables, through.n_points, through.missing) == (
            direct.variables,
            direct.n_points,
            direct.missing,
        )
        np.testing.assert_allclose(through.state(11), direct.state(11), rtol=1e-6)
        through.check_finite()


def test_a_store_with_next_to_no_values_is_refused(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {}, sea_columns=COLUMNS)
    with pytest.raises(DatasetError, match=r"only 0 of 168 points have values to train on"):
        ZarrDataset(store)


def test_a_gappy_store_trains_sharded_as_on_one_rank_and_forecasts_its_kept_points(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    settings = ["data.grid=null", "trainer.val_interval=2", "data.val_fraction=0.25"]
    settings += ["model.hidden_grid=data", "evaluate.at_end_of_training=false", "logging.mlflow=false"]
    _, single = train_sharded_and_single(tmp_path, store, *settings)
    source = ZarrDataset(store)
    plan = load_plan(source.read_plan_key, tmp_path / "sharded", source.variables, ROWS * COLUMNS)  # the ranks' plan
    assert plan is not None and plan.missing == {3, 10} and len(plan.kept) == source.n_points
    forecast_cfg = small_config(
        tmp_path / "single",
        store,
        "data.grid=null",
        f"predict.checkpoint={single / 'latest.pt'}",
        f"predict.initial_dates=[{source.dates[12]}]",
        "predict.steps=1",
        f"predict.output={tmp_path / 'forecasts'}",
    )
    (path,) = predict.run(forecast_cfg)
    written = zarr.open_group(str(path), mode="r")
    kept = np.asarray(written.attrs["source_points"])
    np.testing.assert_array_equal(kept, np.sort(source.stored_points))  # the source's order, the sea left out
    raw = zarr.open_group(str(store), mode="r")
    np.testing.assert_array_equal(written["latitudes"][:], raw["latitudes"][:][kept])
    np.testing.assert_allclose(written["data"][0, :, 0], raw["data"][12, :, 0][:, kept], rtol=1e-6)  # the initial state
