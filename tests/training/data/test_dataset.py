import numpy as np
import pytest
import zarr

from training.config.schema import DataConfig
from training.data import DatasetError, ZarrDataset
from training.data.generate import VARIABLES
from training.data.zarr_compat import open_group_v2, write_array
from training.session import open_dataset


def test_generated_store_has_the_anemoi_layout(small_dataset):
    root = zarr.open_group(str(small_dataset), mode="r")
    assert root["data"].shape == (40, len(VARIABLES), 1, 1600)
    assert list(root.attrs["variables"]) == VARIABLES
    assert root["latitudes"].shape == root["longitudes"].shape == (1600,)
    assert root["dates"].shape == (40,)
    assert root.attrs["frequency"] == "6h"


def test_reader_normalises_and_selects(small_dataset):
    ds = ZarrDataset(small_dataset, ["tracer", "u"])
    assert ds.variables == ["tracer", "u"]
    states = np.stack([ds.state(t) for t in range(ds.n_times)])
    assert states.shape == (40, 1600, 2)
    np.testing.assert_allclose(states.mean(axis=(0, 1)), 0, atol=1e-4)
    np.testing.assert_allclose(states.std(axis=(0, 1)), 1, atol=1e-3)
    block = ds.state(5, slice(100, 200))
    np.testing.assert_array_equal(block, ds.state(5)[100:200])


def test_dynamics_are_real(small_dataset):
    """Rossby-Haurwitz waves move: consecutive states differ, but far less than distant ones."""
    ds = ZarrDataset(small_dataset)
    near = np.abs(ds.state(11) - ds.state(10)).mean()
    far = np.abs(ds.state(30) - ds.state(10)).mean()
    assert 0 < near < far


def test_unknown_variable(small_dataset):
    with pytest.raises(DatasetError, match=r"\['t2m'\] are not in"):
        ZarrDataset(small_dataset, ["u", "t2m"])


def test_missing_path(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        ZarrDataset(tmp_path / "nothing.zarr")


def test_malformed_store(tmp_path):
    root = open_group_v2(tmp_path / "bad.zarr")
    write_array(root, "data", shape=(3, 2), dtype="float32")
    with pytest.raises(DatasetError, match="not an anemoi-style"):
        ZarrDataset(tmp_path / "bad.zarr")


def test_grid_must_match_the_store(small_dataset):
    with pytest.raises(DatasetError, match="o32 has 5248 points but .* has 1600"):
        open_dataset(DataConfig(path=str(small_dataset), grid="o32", generate=False))
