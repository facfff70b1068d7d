"""``scripts/real_data.py``'s (with ``scripts/climate4r.py``) conversion of a climate4R grid (an
R list saved as ``.rda``, as the NCEP daily sea-level pressure comes) into CF NetCDF, and the
store anemoi-datasets builds of it: every value at its date, latitude and longitude. Skipped
without anemoi-datasets and ``rdata`` (they are in ``.venv-anemoi``, as CI runs this)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from training.data import ZarrDataset

pytest.importorskip("anemoi.datasets")
rdata = pytest.importorskip("rdata")
pytestmark = pytest.mark.filterwarnings("ignore:Loading the settings config file:DeprecationWarning")  # anemoi-utils

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "real_data.py"
LATITUDES = np.array([30.0, 32.5, 35.0])  # ascending, as the NCEP file's
LONGITUDES = np.array([-70.0, -67.5, -65.0, -62.5])


@pytest.fixture(scope="module")
def real_data():
    spec = importlib.util.spec_from_file_location("real_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    sys.path.insert(0, str(SCRIPT.parent))  # it imports scripts/climate4r.py, as when run from scripts/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    yield module
    sys.modules.pop("climate4r", None)
    del sys.modules[spec.name]


def _climate4r_grid(days: int) -> tuple[dict, np.ndarray]:
    """A climate4R grid list of ``days`` daily fields whose every value is unique."""
    rng = np.random.default_rng(0)
    data = 101000 + rng.normal(0, 800, (days, len(LATITUDES), len(LONGITUDES)))
    dates = np.array([f"2001-01-{day + 1:02d} GMT" for day in range(days)])
    grid = {
        "Variable": {"varName": np.array(["slp"]), "level": np.array([np.nan])},
        "Data": data,
        "xyCoords": {"x": LONGITUDES, "y": LATITUDES},
        "Dates": {"start": dates, "end": dates},
    }
    return grid, data


def test_a_climate4r_grid_becomes_a_store_with_every_value_in_its_place(tmp_path, real_data):
    grid, data = _climate4r_grid(days=10)
    rda = tmp_path / "slp.rda"
    rdata.write_rda(str(rda), {"NCEP_slp": grid})
    netcdf = real_data.climate4r_msl(rda)
    source = real_data.SOURCES["ncep_msl_daily"]
    recipe = real_data.recipe(source, netcdf)
    recipe["dates"].update(start="2001-01-01T00:00:00", end="2001-01-10T00:00:00")
    store = real_data.create_store(recipe, tmp_path / "slp.zarr")

    ds = ZarrDataset(store)
    assert (ds.variables, ds.n_times, ds.frequency_s) == (["msl"], 10, 86400)
    assert ds.point_set.name == "regional lat-lon 3 x 4 at 2.5 degrees"
    pascal = np.stack([ds.denormalise(ds.state(t))[:, 0] for t in range(ds.n_times)])  # (dates, points)
    for i, lat in enumerate(LATITUDES):
        for j, lon in enumerate(LONGITUDES):
            (point,) = np.flatnonzero((ds.latitudes == lat) & (ds.longitudes == lon))
            np.testing.assert_allclose(pascal[:, point], data[:, i, j], rtol=1e-6)


def test_a_store_of_winters_records_the_rest_of_each_year_as_missing(tmp_path, real_data):
    """Two days at the end of one winter and two at the start of the next: the 275 days between
    are the store's missing dates, and every present value is in its place."""
    days = ["2001-02-27", "2001-02-28", "2001-12-01", "2001-12-02"]
    grid, data = _climate4r_grid(days=len(days))
    grid["Dates"] = {"start": np.array([f"{d} GMT" for d in days]), "end": np.array([f"{d} GMT" for d in days])}
    grid["Data"] = data = data / 370.0  # about 273 K
    rda = tmp_path / "t850.rda"
    rdata.write_rda(str(rda), {"NCEP_Iberia_ta850": grid})
    netcdf = real_data.climate4r_t850(rda)
    gaps = real_data.winter_gaps(days[0], days[-1])
    assert len(gaps) == 275 and gaps[0] == "2001-03-01T00:00:00" and gaps[-1] == "2001-11-30T00:00:00"
    source = real_data.SOURCES["ncep_iberia_t850"]
    recipe = real_data.recipe(source, netcdf)
    recipe["dates"].update(start=f"{days[0]}T00:00:00", end=f"{days[-1]}T00:00:00", missing=gaps)
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "t850.zarr"))
    assert (ds.variables, ds.n_times, len(ds.missing)) == (["t850"], 279, 275)
    present = [t for t in range(ds.n_times) if t not in ds.missing]
    assert present == [0, 1, 277, 278]
    kelvin = np.stack([ds.denormalise(ds.state(t))[:, 0] for t in present])
    (point,) = np.flatnonzero((ds.latitudes == LATITUDES[1]) & (ds.longitudes == LONGITUDES[2]))
    np.testing.assert_allclose(kelvin[:, point], data[:, 1, 2], rtol=1e-6)


@pytest.mark.parametrize(
    "name,variable,convert", [("eobs_iberia_pr", "tp", "eobs_pr"), ("eobs_iberia_2t", "2t", "eobs_tas")]
)
def test_a_land_only_grid_becomes_a_store_whose_sea_is_left_out(tmp_path, real_data, name, variable, convert):
    """E-OBS's precipitation and temperature have no value over the sea: anemoi-datasets builds
    the store with ``build.allow_nans`` (as the recipe asks) and the reader leaves those points out."""
    grid, data = _climate4r_grid(days=6)
    data = grid["Data"] = np.abs(data - 101000) / 100  # mm, or degC
    data[:, 0, :2] = np.nan  # the south-west: sea
    rda = tmp_path / "eobs.rda"
    rdata.write_rda(str(rda), {"EOBS": grid})
    netcdf = getattr(real_data, f"climate4r_{convert}")(rda)
    recipe = real_data.recipe(real_data.SOURCES[name], netcdf)
    assert recipe["build"] == {"allow_nans": True}
    recipe["dates"].update(start="2001-01-01T00:00:00", end="2001-01-06T00:00:00", missing=[])
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "eobs.zarr"))
    assert (ds.variables, ds.n_points) == ([variable], len(LATITUDES) * len(LONGITUDES) - 2)
    ds.check_finite()
    mm = np.stack([ds.denormalise(ds.state(t))[:, 0] for t in range(ds.n_times)])
    for i, lat in enumerate(LATITUDES):
        for j, lon in enumerate(LONGITUDES):
            found = np.flatnonzero((ds.latitudes == lat) & (ds.longitudes == lon))
            assert len(found) == (0 if i == 0 and j < 2 else 1)
            if len(found):
                np.testing.assert_allclose(mm[:, found[0]], data[:, i, j], rtol=1e-5)


def test_climate4r_stations_become_a_point_set_whose_gaps_are_missing_dates(tmp_path, real_data):
    """VALUE's stations: a point set, a station without a value on one day: that day is read as
    a missing date, every other value at its station."""
    rng = np.random.default_rng(1)
    xy = np.array([[-6.7, 41.8], [-9.15, 38.7], [-3.6, 40.5], [2.6, 39.6]])  # (station, lon/lat)
    data = rng.normal(8, 4, (20, len(xy)))
    data[2, 1] = np.nan  # one day of 20: within the dates a station's gaps may cost
    days = np.array([f"2001-01-{d + 1:02d} 00:00:00" for d in range(20)])
    stations = {"Data": data, "xyCoords": xy, "Dates": {"start": days, "end": days}}
    rda = tmp_path / "tas.rda"
    rdata.write_rda(str(rda), {"VALUE_tas": stations})
    recipe = real_data.recipe(real_data.SOURCES["value_iberia_2t"], real_data.climate4r_value_tas(rda))
    recipe["dates"].update(start="2001-01-01T00:00:00", end="2001-01-20T00:00:00", missing=[])
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "tas.zarr"))
    assert (ds.variables, ds.n_points, ds.missing) == (["2t"], 4, {2})
    assert ds.point_set.kind == "unstructured"
    for s, (lon, lat) in enumerate(xy):
        (point,) = np.flatnonzero(np.isclose(ds.latitudes, lat) & np.isclose(ds.longitudes % 360, lon % 360))
        for t in (0, 1, 3, 19):
            assert ds.denormalise(ds.state(t))[point, 0] == pytest.approx(data[t, s], rel=1e-5)


def test_wfde5s_files_merge_into_one_land_only_store_of_six_variables(tmp_path, real_data):
    """WFDE5 comes as one file a variable (``lat``/``lon``, hourly): merged into one NetCDF, the
    store holds the six variables, the sea (NaN in every file) left out, every value in place."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(2)
    times = np.array([f"2017-01-01T{h:02d}:00" for h in range(5)], dtype="datetime64[ns]")
    fields = {}
    for file, _, variable in real_data.WFDE5_FILES:
        data = rng.uniform(1, 2, (len(times), len(LATITUDES), len(LONGITUDES))).astype("float32")
        data[:, 2, 3] = np.nan  # the north-east: sea
        fields[variable] = data
        coords = {"time": times, "lat": LATITUDES, "lon": LONGITUDES}
        xr.Dataset({variable: (("time", "lat", "lon"), data)}, coords=coords).to_netcdf(tmp_path / file)
    netcdf = real_data.wfde5_merged(tmp_path / real_data.WFDE5_FILES[0][0])
    recipe = real_data.recipe(real_data.SOURCES["wfde5_uk_land"], netcdf)
    recipe["dates"].update(start="2017-01-01T00:00:00", end="2017-01-01T04:00:00")
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "wfde5.zarr"))
    assert sorted(ds.variables) == sorted(fields) and (ds.n_times, ds.n_points) == (5, 11)
    values = np.stack([ds.denormalise(ds.state(t)) for t in range(ds.n_times)])  # (dates, points, variables)
    (point,) = np.flatnonzero((ds.latitudes == LATITUDES[1]) & (ds.longitudes == LONGITUDES[2]))
    for v, name in enumerate(ds.variables):
        np.testing.assert_allclose(values[:, point, v], fields[name][:, 1, 2], rtol=1e-6)


def test_cordexs_rotated_grids_merge_into_one_store_with_each_value_at_its_true_coordinates(tmp_path, real_data):
    """CORDEX's two files (temperature, precipitation) on a rotated-pole grid: ``xyCoords`` holds
    the rotated axes and each cell's true longitude and latitude (2-D). Merged, the store holds
    both variables on every cell, each value at its cell's true coordinates."""
    rng = np.random.default_rng(3)
    rlat, rlon = np.array([-14.85, -14.41, -13.97]), np.array([-22.93, -22.49, -22.05, -21.61])
    lat = 31.8 + 0.44 * np.arange(3)[:, None] + 0.15 * np.arange(4)[None, :]  # a curvilinear grid
    lon = -8.3 + 0.47 * np.arange(4)[None, :] - 0.1 * np.arange(3)[:, None]
    days = np.array([f"1982-12-{d + 1:02d} 00:00:00 GMT" for d in range(5)])
    fields = {}
    for file, _, variable, _ in real_data.CORDEX_FILES:
        fields[variable] = data = rng.uniform(0, 20, (len(days), len(rlat), len(rlon)))
        grid = {
            "Data": data,
            "xyCoords": {"x": rlon, "y": rlat, "lon": lon, "lat": lat},
            "Dates": {"start": days, "end": days},
        }
        rdata.write_rda(str(tmp_path / file), {file.removesuffix(".rda"): grid})
    netcdf = real_data.climate4r_rotated(tmp_path / real_data.CORDEX_FILES[0][0])
    recipe = real_data.recipe(real_data.SOURCES["cordex_iberia"], netcdf)
    recipe["dates"].update(start="1982-12-01T00:00:00", end="1982-12-05T00:00:00", missing=[])
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "cordex.zarr"))
    assert (ds.variables, ds.n_points, ds.n_times) == (["2t", "tp"], 12, 5)
    values = np.stack([ds.denormalise(ds.state(t)) for t in range(ds.n_times)])  # (dates, points, variables)
    for i in range(len(rlat)):
        for j in range(len(rlon)):
            (point,) = np.flatnonzero(
                np.isclose(ds.latitudes, lat[i, j]) & np.isclose((ds.longitudes - lon[i, j] + 180) % 360, 180)
            )
            for v, name in enumerate(ds.variables):
                np.testing.assert_allclose(values[:, point, v], fields[name][:, i, j], rtol=1e-5, atol=1e-5)


def test_ncep_iberias_three_fields_merge_into_one_store_and_a_file_off_the_grid_is_refused(tmp_path, real_data):
    """The NCEP Iberia files of 850 hPa temperature and humidity and of sea-level pressure (each a
    climate4R grid on the same dates and axes) merge into one store of three variables, each
    value at its date, latitude and longitude; a file on other axes stops the build."""
    rng = np.random.default_rng(4)
    days = np.array([f"1982-12-{d + 1:02d} GMT" for d in range(4)])
    fields = {}
    for file, _, variable, _ in real_data.NCEP_IBERIA_FILES:
        fields[variable] = data = rng.uniform(0, 1, (len(days), len(LATITUDES), len(LONGITUDES)))
        grid = {"Data": data, "xyCoords": {"x": LONGITUDES, "y": LATITUDES}, "Dates": {"start": days, "end": days}}
        rdata.write_rda(str(tmp_path / file), {file.removesuffix(".rda"): grid})
    netcdf = real_data.climate4r_ncep_iberia(tmp_path / real_data.NCEP_IBERIA_FILES[0][0])
    recipe = real_data.recipe(real_data.SOURCES["ncep_iberia_t_q_msl"], netcdf)
    recipe["dates"].update(start="1982-12-01T00:00:00", end="1982-12-04T00:00:00", missing=[])
    ds = ZarrDataset(real_data.create_store(recipe, tmp_path / "ncep_iberia.zarr"))
    assert (sorted(ds.variables), ds.n_points, ds.n_times) == (["msl", "q850", "t850"], 12, 4)
    values = np.stack([ds.denormalise(ds.state(t)) for t in range(ds.n_times)])  # (dates, points, variables)
    for i, lat in enumerate(LATITUDES):
        for j, lon in enumerate(LONGITUDES):
            (point,) = np.flatnonzero((ds.latitudes == lat) & (np.isclose((ds.longitudes - lon + 180) % 360, 180)))
            for v, name in enumerate(ds.variables):
                np.testing.assert_allclose(values[:, point, v], fields[name][:, i, j], rtol=1e-5, atol=1e-6)

    other = tmp_path / "shifted"
    other.mkdir()
    for k, (file, _, _, _) in enumerate(real_data.NCEP_IBERIA_FILES):
        shifted = LONGITUDES + (2.5 if k == 2 else 0.0)  # the pressure file a column to the east
        grid = {
            "Data": fields["t850"],
            "xyCoords": {"x": shifted, "y": LATITUDES},
            "Dates": {"start": days, "end": days},
        }
        rdata.write_rda(str(other / file), {file.removesuffix(".rda"): grid})
    with pytest.raises(SystemExit, match="NCEP_Iberia_psl.rda is not on NCEP_Iberia_ta850.rda's dates and grid"):
        real_data.climate4r_ncep_iberia(other / real_data.NCEP_IBERIA_FILES[0][0])
