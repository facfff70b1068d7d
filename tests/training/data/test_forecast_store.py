"""The forecast store: chunk regions (arithmetic), parallel writes on 1, 2 and 3 local gloo ranks
read back by ``ZarrDataset`` (and by anemoi-datasets where it is installed), refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes
from tests.rank_pool import RankError
from training.data import ZarrDataset
from training.data.forecast_store import CHUNK_POINTS_CAP, ForecastStore, chunk_points, chunk_regions

N, VARIABLES, STEPS = 101, ["t2m", "u10", "msl"], 3
INIT, LEAD_S = np.datetime64("2020-03-01T06:00:00", "s"), 6 * 3600
MEAN, STDEV = np.array([280.0, 0.5, 101_000.0]), np.array([12.0, 4.0, 900.0])
LAYOUTS = [(N,), tuple(shard_sizes(N, 2)), tuple(shard_sizes(N, 3)), (5, 60, 36), (40, 7, 54), (45, 0, 30, 26)]


def _forecast(seed: int = 0) -> np.ndarray:
    """Known states ``(steps, points, variables)`` in physical units."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(STEPS, N, len(VARIABLES))) * STDEV + MEAN).astype(np.float32)


def _coordinates() -> tuple[np.ndarray, np.ndarray]:
    return np.linspace(-89.0, 89.0, N), np.linspace(0.0, 356.4, N)


def _dates() -> np.ndarray:
    return INIT + np.arange(STEPS) * np.timedelta64(LEAD_S, "s")


def _create(group, path: str, sizes: tuple[int, ...], rank: int, **overrides) -> ForecastStore:
    latitudes, longitudes = _coordinates()
    arguments = {
        "variables": VARIABLES,
        "latitudes": latitudes,
        "longitudes": longitudes,
        "dates": _dates(),
        "frequency_s": LEAD_S,
        "mean": MEAN,
        "stdev": STDEV,
        "attributes": {"initial_date": INIT, "checkpoint": "run/last.ckpt", "provenance": {"git_commit": "abc"}},
        "layout": ShardLayout(sizes, rank),
        "group": group,
    }
    return ForecastStore.create(path, **{**arguments, **overrides})


def _write_forecast(group, path: str, sizes: tuple[int, ...], order: np.ndarray | None = None) -> dict:
    """On each rank: write only this rank's block of :func:`_forecast` (``order``: the store
    position of each of its points); report the region."""
    import torch.distributed as dist

    rank = 0 if group is None else dist.get_rank(group)
    store = _create(group, path, sizes, rank, order=order)
    start = shard_offsets(list(sizes))[rank]
    block = _forecast()[:, start : start + sizes[rank]]
    for k in range(STEPS):
        store.write(k, block[k])
    store.close()
    return {"region": store.region, "chunk": store.chunk}


@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6), cap=st.integers(1, 50))
def test_regions_are_chunk_aligned_and_cover_the_points_once(sizes, cap):
    chunk = chunk_points(sizes, cap)
    assert 1 <= chunk <= min(min(sizes), cap)
    regions = chunk_regions(sizes, chunk)
    covered = [p for a, b in regions for p in range(a, b)]
    assert covered == list(range(sum(sizes)))  # every point once, in order
    starts = shard_offsets(sizes)
    for r, (a, b) in enumerate(regions):
        assert a % chunk == 0 and (b % chunk == 0 or b == sum(sizes))
        assert starts[r] <= a < starts[r] + sizes[r]  # starts inside the rank's own block
        assert b - (starts[r] + sizes[r]) < chunk  # and needs less than a chunk from the next ranks


def test_chunk_points_cap_and_empty():
    assert chunk_points([10**6, 10**6]) == CHUNK_POINTS_CAP
    assert chunk_points([5, 60, 36]) == 5 and chunk_points([0, 7, 9]) == 7
    with pytest.raises(ValueError):
        chunk_points([0, 0])


@pytest.mark.parametrize("sizes", LAYOUTS, ids=lambda s: "-".join(map(str, s)))
def test_parallel_write_reads_back(rank_pool, tmp_path, sizes):
    path = tmp_path / "forecast.zarr"
    out = rank_pool.run_ok(_write_forecast, len(sizes), str(path), sizes)
    chunk = out[0]["chunk"]
    assert chunk == min(s for s in sizes if s > 0)
    regions = [o["region"] for o in out]
    assert regions == chunk_regions(sizes, chunk) and regions[0][0] == 0 and regions[-1][1] == N
    assert [p for a, b in regions for p in range(a, b)] == list(range(N))
    assert not (tmp_path / "forecast.zarr.partial").exists()

    expected = _forecast()
    ds = ZarrDataset(path)
    assert ds.variables == VARIABLES and ds.n_times == STEPS and ds.n_members == 1 and ds.n_points == N
    assert list(ds.dates) == list(_dates()) and ds.frequency_s == LEAD_S and ds.missing == frozenset()
    order = ds.point_set.order  # the reader's processor order (a Hilbert curve through these points)
    np.testing.assert_array_equal(ds.latitudes, _coordinates()[0][order])
    np.testing.assert_array_equal(ds.longitudes, _coordinates()[1][order])
    np.testing.assert_allclose(ds.mean, MEAN.astype(np.float32))
    np.testing.assert_allclose(ds.stdev, STDEV.astype(np.float32))
    for k in range(STEPS):
        np.testing.assert_allclose(ds.denormalise(ds.state(k)), expected[k][order], rtol=1e-6, atol=1e-3)
        block = slice(N // 3, N // 2)  # a rank's block: its points picked from the store's span
        np.testing.assert_allclose(ds.denormalise(ds.state(k, block)), expected[k][order][block], rtol=1e-6, atol=1e-3)
    ds.check_finite()

    root = zarr.open_group(str(path), mode="r")
    assert root["data"].chunks == (1, len(VARIABLES), 1, chunk)
    np.testing.assert_array_equal(root["data"][:, :, 0].transpose(0, 2, 1), expected)  # exact float32
    np.testing.assert_array_equal(root["minimum"][:], expected.min(axis=(0, 1)))
    np.testing.assert_array_equal(root["maximum"][:], expected.max(axis=(0, 1)))
    attrs = dict(root.attrs)
    assert attrs["initial_date"] == str(INIT) and attrs["checkpoint"] == "run/last.ckpt"
    assert attrs["provenance"]["shard_sizes"] == list(sizes) and attrs["provenance"]["git_commit"] == "abc"
    assert attrs["name_to_index"] == {v: i for i, v in enumerate(VARIABLES)} and attrs["missing_dates"] == []


def test_existing_path_is_refused_on_every_rank(rank_pool, tmp_path):
    sizes = tuple(shard_sizes(N, 2))
    for existing in ("forecast.zarr", "forecast.zarr.partial"):
        (tmp_path / existing).mkdir()
        (tmp_path / existing / "keep").write_text("not overwritten")
        out = rank_pool.run(_write_forecast, 2, str(tmp_path / "forecast.zarr"), sizes)
        assert all(isinstance(o, RankError) and o.type == "FileExistsError" for o in out), out
        assert "never overwritten" in out[1].message
        assert (tmp_path / existing / "keep").read_text() == "not overwritten"
        (tmp_path / existing / "keep").unlink()
        (tmp_path / existing).rmdir()


def test_one_rank_in_process_unwritten_dates_are_missing(tmp_path):
    store = _create(None, str(tmp_path / "f.zarr"), (N,), 0)
    assert store.writing_path.exists() and not (tmp_path / "f.zarr").exists()
    store.write(0, _forecast()[0])
    store.write(1, _forecast()[1])
    with pytest.raises(ValueError, match="expected"):
        store.write(2, _forecast()[2][:50])
    store.close()
    ds = ZarrDataset(tmp_path / "f.zarr")
    assert ds.missing == frozenset({2})
    order = ds.point_set.order
    np.testing.assert_allclose(ds.denormalise(ds.state(1)), _forecast()[1][order], rtol=1e-6, atol=1e-3)


def test_bad_arguments(tmp_path):
    path = str(tmp_path / "x.zarr")
    with pytest.raises(ValueError, match="written by the forecast store"):
        _create(None, path, (N,), 0, attributes={"variables": ["a"]})
    with pytest.raises(ValueError, match="apart"):
        _create(None, path, (N,), 0, frequency_s=3600)
    with pytest.raises(ValueError, match=r"\(101,\)"):
        _create(None, path, (N,), 0, latitudes=np.zeros(N - 1))
    with pytest.raises(ValueError, match="rank 0 of 2"):
        _create(None, path, (50, 51), 0)
    assert not any(Path(tmp_path).iterdir())  # nothing created


def test_anemoi_datasets_reads_the_forecast(rank_pool, tmp_path):
    anemoi_datasets = pytest.importorskip("anemoi.datasets")
    path = tmp_path / "forecast.zarr"
    rank_pool.run_ok(_write_forecast, 3, str(path), (40, 7, 54))  # regions [0, 42), [42, 49), [49, 101)
    ds = anemoi_datasets.open_dataset(str(path))
    expected = _forecast()
    assert ds.shape == (STEPS, len(VARIABLES), 1, N) and ds.variables == VARIABLES
    assert list(ds.dates) == list(_dates()) and ds.frequency.total_seconds() == LEAD_S and ds.missing == set()
    np.testing.assert_array_equal(ds.latitudes, _coordinates()[0])
    np.testing.assert_array_equal(ds.longitudes, _coordinates()[1])
    for k in range(STEPS):
        np.testing.assert_array_equal(ds[k][:, 0].T, expected[k])
    stats = ds.statistics
    np.testing.assert_array_equal(stats["mean"], MEAN)
    np.testing.assert_array_equal(stats["stdev"], STDEV)
    np.testing.assert_array_equal(stats["minimum"], expected.min(axis=(0, 1)))
    assert tuple(ds.field_shape) == (N,)


ORDERED_LAYOUTS = [(N,), tuple(shard_sizes(N, 2)), (40, 7, 54), (45, 0, 30, 26)]


@pytest.mark.parametrize("sizes", ORDERED_LAYOUTS, ids=lambda s: "-".join(map(str, s)))
def test_states_in_another_order_are_written_at_their_store_positions(rank_pool, tmp_path, sizes):
    """The states come in the layout's (processor's) order; the store holds them, and their
    coordinates, in the source's: point ``i`` at position ``order[i]``, whatever the ranks."""
    order = np.random.default_rng(7).permutation(N)
    path = tmp_path / "forecast.zarr"
    if len(sizes) == 1:
        _write_forecast(None, str(path), sizes, order)
    else:
        rank_pool.run_ok(_write_forecast, len(sizes), str(path), sizes, order)
    root = zarr.open_group(str(path), mode="r")
    latitudes, longitudes = _coordinates()
    np.testing.assert_array_equal(root["latitudes"][:][order], latitudes)
    np.testing.assert_array_equal(root["longitudes"][:][order], longitudes)
    written = root["data"][:, :, 0].transpose(0, 2, 1)  # (steps, store positions, variables)
    np.testing.assert_array_equal(written[:, order], _forecast())
    np.testing.assert_array_equal(root["minimum"][:], _forecast().min(axis=(0, 1)))
    ds = ZarrDataset(path)  # the reader's order is its own, from the coordinates: the same states
    reader = ds.point_set.order
    np.testing.assert_allclose(ds.denormalise(ds.state(1)), written[1][reader], rtol=1e-6, atol=1e-3)


def test_an_order_that_is_no_permutation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="each of the 101 store positions once"):
        _create(None, str(tmp_path / "x.zarr"), (N,), 0, order=np.zeros(N, np.int64))
    assert not any(Path(tmp_path).iterdir())
