import shutil

import numpy as np
import pytest
import zarr

from training.config.schema import DataConfig
from training.data import DatasetError, ZarrDataset
from training.data.generate import VARIABLES
from training.data.open_store import open_dataset
from training.data.state_cache import StateCache
from training.data.zarr_compat import open_group_v2, write_array


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


def test_states_are_read_once_and_kept_read_only(small_dataset):
    """A state read again comes from memory, equal to a fresh read, and cannot be changed in place."""
    ds = ZarrDataset(small_dataset)
    first = ds.state(7, slice(10, 50))
    assert ds.state(7, slice(10, 50)) is first
    np.testing.assert_array_equal(first, ZarrDataset(small_dataset).state(7, slice(10, 50)))
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 1.0
    assert ds.state(7) is not first  # another block of points is another state


def test_the_state_cache_keeps_the_last_read_within_its_bytes():
    cache = StateCache(capacity=3 * 400)
    for t in range(4):
        cache.put((t,), np.full((10, 10), t, np.float32))  # 400 bytes each
    assert cache.get((0,)) is None and cache.size == 1200
    assert cache.get((1,)) is not None  # read: now the most recent
    cache.put((4,), np.zeros((10, 10), np.float32))
    assert cache.get((2,)) is None and cache.get((1,)) is not None
    too_large = cache.put((5,), np.zeros((20, 20), np.float32))  # over the capacity: returned, not kept
    assert cache.get((5,)) is None and not too_large.flags.writeable


def test_a_small_store_is_preloaded_whole_and_reads_the_same(small_dataset):
    ds = ZarrDataset(small_dataset)
    points = slice(100, 700)
    assert ds.preload(points, [0])
    fresh = ZarrDataset(small_dataset)
    for t in (0, 17, ds.n_times - 1):
        state = ds._states.get((t, 0, points.start, points.stop))
        assert state is not None and ds.state(t, points) is state  # from memory
        np.testing.assert_array_equal(state, fresh.state(t, points))
    too_small = ZarrDataset(small_dataset)
    too_small._states.capacity = 2 * ds.n_times * 600 * len(ds.variables) * 4 - 4  # half of it is one byte short
    assert not too_small.preload(points, [0]) and too_small._states.size == 0


def test_a_damaged_chunk_met_by_the_preload_is_one_line_naming_the_dates(tmp_path, small_dataset):
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    for chunk in (store / "data").glob("3.*"):
        chunk.write_bytes(b"not a blosc chunk" * 10)
    with pytest.raises(DatasetError, match=r"^cannot read dates .* to .* of .*store.zarr: .*data.preload=false"):
        ZarrDataset(store).preload(slice(None), [0])
