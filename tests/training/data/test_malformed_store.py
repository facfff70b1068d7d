"""Malformed or damaged Zarr stores give a DatasetError naming the store (and date), not a
traceback from deep inside zarr or numcodecs."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.training.conftest import small_config
from training.data import DatasetError, ZarrDataset
from training.data.zarr_compat import open_group_v2, write_array
from training.launch.launcher import prepare


@pytest.fixture
def store(tmp_path, small_dataset):
    """A private copy of the small dataset to damage."""
    return shutil.copytree(small_dataset, tmp_path / "store.zarr")


def _corrupt_chunk(store):
    (store / "data" / "5.0.0.0").write_bytes(b"not a blosc chunk" * 10)


def _bad_metadata(store):
    (store / "data" / ".zarray").write_text("{not json")


def _no_variables(store):
    attrs = json.loads((store / ".zattrs").read_text())
    del attrs["variables"]
    (store / ".zattrs").write_text(json.dumps(attrs))


def _no_members(store):
    root = open_group_v2(store, mode="a")
    shape = root["data"].shape
    del root["data"]
    write_array(
        root, "data", shape=(shape[0], shape[1], 0, shape[3]), dtype="float32", chunks=(1, shape[1], 1, shape[3])
    )


def _plain_file(store):
    shutil.rmtree(store)
    store.write_text("hello")


@pytest.mark.parametrize(
    "damage,message",
    [
        (_corrupt_chunk, r"cannot read date 2020-01-02T06:00:00 \(index 5\) of .*store.zarr: RuntimeError"),
        (_bad_metadata, "is not an anemoi-style Zarr dataset: JSONDecodeError"),
        (_no_variables, "is not an anemoi-style Zarr dataset: KeyError"),
        (_no_members, "has no ensemble member"),
        (_plain_file, "is not an anemoi-style Zarr dataset"),
    ],
)
def test_damaged_store_fails_in_prepare(tmp_path, store, damage, message):
    damage(store)
    with pytest.raises(DatasetError, match=message):
        prepare(small_config(tmp_path / "run", store))


def test_a_corrupt_chunk_read_during_training_names_the_date(store):
    """With the up-front check off, a damaged chunk still fails clearly when a step reads it."""
    _corrupt_chunk(store)
    ds = ZarrDataset(store)
    assert ds.state(4).shape == (1600, len(ds.variables))
    with pytest.raises(DatasetError, match=r"cannot read date 2020-01-02T06:00:00 \(index 5\), variables psi, .*, of "):
        ds.state(5)


def test_a_store_whose_statistics_are_not_finite_is_refused_by_name(store):
    """A NaN mean (a hand-written store's statistics over values with gaps) would make every
    normalised state NaN and the first loss NaN: refused on opening, naming the variable."""
    root = open_group_v2(store, mode="a")
    mean = root["mean"][:]
    mean[1] = float("nan")
    root["mean"][:] = mean
    name = json.loads((store / ".zattrs").read_text())["variables"][1]
    with pytest.raises(DatasetError, match=rf"statistics \(mean, stdev\) of \['{name}'\] are not finite"):
        ZarrDataset(store)
    others = [v for v in json.loads((store / ".zattrs").read_text())["variables"] if v != name]
    assert ZarrDataset(store, variables=others).variables == others  # left out, it is not read
