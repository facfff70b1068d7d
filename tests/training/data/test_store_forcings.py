"""A store that anemoi-datasets builds with its ``forcings`` source (as anemoi's training stores
are built) holds the position and time forcings as variables: gridshard gives them to the model
and never predicts or scores them, under whatever names the store uses. The fields are the tests'
ERA5 sample (``tests/data``); skipped without anemoi-datasets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.data import ZarrDataset

pytest.importorskip("anemoi.datasets")
pytestmark = pytest.mark.filterwarnings("ignore:Loading the settings config file:DeprecationWarning")  # anemoi-utils

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "era5_uk_2t_2019-03_6h.grib"
FORCINGS = ["cos_latitude", "cos_solar_zenith_angle", "cos_julian_day", "sin_local_time"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store-forcings")
    grib = {"grib": {"path": str(SAMPLE), "param": ["2t"]}}
    recipe = {
        "dates": {"start": "2019-03-01T00:00:00", "end": "2019-03-03T00:00:00", "frequency": "6h"},
        "input": {"join": [grib, {"forcings": {"template": "${input.join.0.grib}", "param": FORCINGS}}]},
    }
    (root / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    command = [sys.executable, "-m", "anemoi.datasets", "create", str(root / "recipe.yaml"), str(root / "s.zarr")]
    done = subprocess.run(command, capture_output=True, text=True)  # its own process: see test_grib_stores
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "s.zarr"


def test_the_stores_computed_forcings_are_given_never_predicted(store: Path) -> None:
    dataset = ZarrDataset(store)  # no data.forcing at all
    assert sorted(dataset.variables) == sorted(["2t", *FORCINGS])
    assert dataset.roles.prognostic == ("2t",) and dataset.roles.outputs == ["2t"]
    assert sorted(dataset.roles.forcing) == sorted(FORCINGS) and not dataset.roles.computed


def test_the_readme_forcings_are_the_stores_where_it_holds_them(store: Path) -> None:
    """``data=zarr``'s list names ``insolation``: the store's ``cos_solar_zenith_angle`` is that
    field, so it is not computed a second time."""
    dataset = ZarrDataset(store, forcing=["cos_latitude", "sin_latitude", "insolation"])
    assert dataset.roles.outputs == ["2t"] and dataset.roles.computed == ("sin_latitude",)
    assert "cos_solar_zenith_angle" in dataset.roles.forcing


def test_a_forcing_may_still_be_asked_for_as_a_diagnostic(store: Path) -> None:
    dataset = ZarrDataset(store, diagnostic=["cos_julian_day"])
    assert dataset.roles.outputs == ["2t", "cos_julian_day"] and "cos_julian_day" not in dataset.roles.forcing


def test_open_dataset_reads_the_same_record(store: Path) -> None:
    from training.data.anemoi_source import AnemoiDataset

    dataset = AnemoiDataset({"dataset": str(store), "select": ["2t", "cos_solar_zenith_angle"]})
    assert dataset.roles.outputs == ["2t"] and dataset.roles.forcing == ("cos_solar_zenith_angle",)
