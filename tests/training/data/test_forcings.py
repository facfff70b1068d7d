"""Computed forcings against their definitions, and the variables' roles."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from training.data import ZarrDataset
from training.data.anemoi_layout import write_anemoi_store
from training.data.forcings import COMPUTED, VariableRoles, computed_forcings, day_of_year, store_given_fields


def _at(*dates: str) -> np.ndarray:
    return np.array(dates, dtype="datetime64[s]")


def test_position_and_time_forcings_follow_their_definitions():
    lat, lon = np.array([0.0, 60.0, -30.0]), np.array([0.0, 90.0, -45.0])
    names = ("cos_latitude", "sin_longitude", "cos_local_time", "sin_local_time", "cos_julian_day")
    values = computed_forcings(names, _at("2021-01-01T12:00", "2021-07-02T06:00"), lat, lon)
    assert values.shape == (2, 3, 5) and values.dtype == np.float32
    np.testing.assert_allclose(values[:, :, 0], np.cos(np.radians(lat))[None].repeat(2, 0), atol=1e-7)
    np.testing.assert_allclose(values[0, :, 1], np.sin(np.radians(lon)), atol=1e-7)
    local_hours = np.array([[12.0, 18.0, 9.0], [6.0, 12.0, 3.0]])  # UTC + longitude / 15
    np.testing.assert_allclose(values[:, :, 2], np.cos(2 * np.pi * local_hours / 24), atol=1e-6)
    np.testing.assert_allclose(values[:, :, 3], np.sin(2 * np.pi * local_hours / 24), atol=1e-6)
    np.testing.assert_allclose(values[0, :, 4], np.cos(2 * np.pi * 0.5 / 365.25), atol=1e-7)
    assert day_of_year(_at("2020-12-31T18:00"))[0] == pytest.approx(365.75)  # a leap year


def test_insolation_is_the_sun_overhead_at_noon_and_zero_at_night():
    lat, lon = np.array([0.0, 0.0, 23.4, -23.4, 80.0]), np.array([0.0, 180.0, 0.0, 0.0, 0.0])
    equinox, june, december = (
        computed_forcings(("insolation",), _at(d), lat, lon)[0, :, 0]
        for d in ("2021-03-20T12:00", "2021-06-21T12:00", "2021-12-21T12:00")
    )
    assert equinox[0] > 0.99 and equinox[1] == 0  # noon on the equator; midnight on the other side
    assert june[2] > 0.99 and december[3] > 0.99  # the sun over the tropics at the solstices
    assert june[4] > 0.5 and december[4] == 0  # polar day and polar night
    assert (equinox >= 0).all() and (equinox <= 1).all()


def test_roles_split_the_variables_and_name_bad_keys():
    roles = VariableRoles.build(["t2m", "lsm", "tp", "msl"], ["lsm", "insolation", "cos_latitude"], ["tp"])
    assert roles.prognostic == ("t2m", "msl") and roles.forcing == ("lsm",)
    assert roles.computed == ("insolation", "cos_latitude") and roles.diagnostic == ("tp",)
    assert roles.inputs == ["t2m", "msl", "lsm", "insolation", "cos_latitude"]
    assert roles.outputs == ["t2m", "msl", "tp"] and roles.output_columns() == [0, 3, 2]
    with pytest.raises(ValueError, match=r"data.forcing names \['sst'\]: neither dataset variables"):
        VariableRoles.build(["t2m"], ["sst"], None)
    with pytest.raises(ValueError, match=r"data.diagnostic names \['insolation'\]"):
        VariableRoles.build(["t2m"], None, ["insolation"])
    with pytest.raises(ValueError, match=r"\['tp'\] are in both data.forcing and data.diagnostic"):
        VariableRoles.build(["t2m", "tp"], ["tp"], ["tp"])
    with pytest.raises(ValueError, match="no prognostic variable left"):
        VariableRoles.build(["lsm"], ["lsm"], None)
    assert set(COMPUTED) >= {"cos_julian_day", "sin_local_time", "insolation"}


def test_a_stores_constant_fields_are_given_never_predicted():
    """anemoi's ``constant_fields`` (a land-sea mask, orography): forcings without being listed,
    predicted by no one; ``data.diagnostic`` may still claim one, and a listed one is not doubled."""
    roles = VariableRoles.build(["t2m", "lsm", "z"], ["cos_latitude"], None, ("lsm", "z", "absent"))
    assert roles.prognostic == ("t2m",) and roles.forcing == ("lsm", "z") and roles.outputs == ["t2m"]
    roles = VariableRoles.build(["t2m", "lsm", "z"], ["z"], ["lsm"], ("lsm", "z"))
    assert roles.forcing == ("z",) and roles.diagnostic == ("lsm",)
    roles = VariableRoles.build(["lsm", "z"], None, None, ("lsm", "z"))  # all there is: still predicted
    assert roles.prognostic == ("lsm", "z") and not roles.forcing


def test_a_store_with_constant_fields_gives_them_as_inputs(tmp_path):
    lat, lon = np.repeat(np.arange(50, 46, -1.0), 4), np.tile(np.arange(0, 4, 1.0), 4)
    rng = np.random.default_rng(0)
    data = np.stack([rng.normal(size=(8, 16)), np.tile(rng.normal(size=16), (8, 1))], axis=1)[:, :, None]
    dates = np.arange("2020-01-01T00", "2020-01-03T00", 6, dtype="datetime64[h]")
    store = write_anemoi_store(tmp_path / "s.zarr", data, dates, ["t2m", "lsm"], lat, lon, None)
    dataset = ZarrDataset(store, forcing=["cos_latitude"])
    assert dataset.constant_fields == ("lsm",) and dataset.roles.forcing == ("lsm",)
    assert dataset.roles.outputs == ["t2m"] and dataset.roles.inputs == ["t2m", "lsm", "cos_latitude"]


def test_a_store_that_records_a_computed_forcing_gives_it_as_an_input(tmp_path):
    """As anemoi-datasets' ``forcings`` source records its fields (tests/training/data/
    test_store_forcings.py builds such a store with anemoi-datasets itself)."""
    lat, lon = np.repeat(np.arange(50, 46, -1.0), 4), np.tile(np.arange(0, 4, 1.0), 4)
    data = np.random.default_rng(0).normal(size=(8, 2, 1, 16))
    dates = np.arange("2020-01-01T00", "2020-01-03T00", 6, dtype="datetime64[h]")
    store = write_anemoi_store(tmp_path / "s.zarr", data, dates, ["t2m", "cos_solar_zenith_angle"], lat, lon, None)
    assert ZarrDataset(store).roles.outputs == ["t2m", "cos_solar_zenith_angle"]  # recorded as a MARS field
    root = zarr.open_group(str(store), mode="r+")
    metadata = dict(root.attrs["variables_metadata"])
    metadata["cos_solar_zenith_angle"] = {"computed_forcing": True, "constant_in_time": False}
    root.attrs["variables_metadata"] = metadata
    dataset = ZarrDataset(store, forcing=["insolation", "cos_julian_day"])
    assert dataset.roles.outputs == ["t2m"] and dataset.roles.forcing == ("cos_solar_zenith_angle",)
    assert dataset.roles.computed == ("cos_julian_day",)


def test_a_stores_own_record_says_which_variables_are_given():
    """anemoi-datasets records its ``forcings`` source's fields as computed forcings; a store
    without the record is read by the names; a record that says otherwise wins over the name."""
    variables = ["t2m", "lsm", "cos_solar_zenith_angle", "toa_flux", "insolation", "sin_julian_day"]
    metadata = {
        "t2m": {"units": "K"},
        "toa_flux": {"computed_forcing": True, "constant_in_time": False},
        "insolation": {"mars": {"param": "insolation"}},  # a field from MARS under a forcing's name: predicted
        "sin_julian_day": {"units": "dimensionless"},  # an older record, silent: read by the name
    }
    given = store_given_fields(variables, ["lsm"], metadata)
    assert given == ("lsm", "cos_solar_zenith_angle", "toa_flux", "sin_julian_day")
    assert store_given_fields(variables, (), {"sin_julian_day": {"computed_forcing": False}}) == (
        "cos_solar_zenith_angle",
        "insolation",
    )
    assert store_given_fields(variables, None, None) == ("cos_solar_zenith_angle", "insolation", "sin_julian_day")
    roles = VariableRoles.build(variables, None, None, given)
    assert roles.outputs == ["t2m", "insolation"] and roles.forcing == given


def test_one_field_under_anemois_two_names_is_given_once():
    roles = VariableRoles.build(["t2m", "cos_solar_zenith_angle"], ["insolation", "cos_julian_day"], None)
    assert roles.forcing == ("cos_solar_zenith_angle",) and roles.computed == ("cos_julian_day",)
    roles = VariableRoles.build(["t2m", "cos_solar_zenith_angle"], ["insolation", "cos_solar_zenith_angle"], None)
    assert roles.forcing == ("cos_solar_zenith_angle",) and not roles.computed
