"""The tracer centroid's position error: a known displacement, and the same on 1 and 3 ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from processor.distributed import ShardLayout, shard_sizes
from processor.geometry import EARTH_RADIUS_KM, great_circle_km, grid_spacing_km, unit_vectors
from processor.grids import get_grid
from processor.point_sets import point_set
from training.skill.centroid import CentroidAccumulator

GRID = get_grid("o16")


def _blob(lon0: float) -> np.ndarray:
    """``(points, 2)``: a Gaussian blob at (20N, lon0) in column 1, noise in column 0."""
    xyz = unit_vectors(GRID.latitudes, GRID.longitudes)
    centre = unit_vectors(np.array([20.0]), np.array([lon0]))[0]
    blob = np.exp(-(1 - xyz @ centre) / 0.02)
    return np.stack([np.random.default_rng(0).normal(size=len(xyz)), blob], axis=1)


def _accumulate(points: slice, shifts: list[float]) -> CentroidAccumulator:
    xyz = unit_vectors(GRID.latitudes, GRID.longitudes)[points]
    weights = point_set(GRID.latitudes, GRID.longitudes).area_weights()[points]
    acc = CentroidAccumulator("tracer", 1, xyz, weights, [6.0, 12.0], ("model", "persistence"))
    truth = _blob(30.0)[points]
    for lead, shift in enumerate(shifts):
        acc.add("model", lead, _blob(30.0 + shift)[points], truth, sample_id=0)
        acc.add("persistence", lead, _blob(30.0 - 2 * shift)[points], truth, sample_id=0)
    return acc


def test_a_displaced_blob_is_as_far_off_as_it_was_moved():
    table = _accumulate(slice(None), [0.0, 5.0]).finalize(None, None, grid_spacing_km(GRID.n_points))
    assert table.error_km["model"][0] == pytest.approx(0.0, abs=1e-6)
    # The blob's centre moved 5 degrees of longitude at 20N.
    moved = great_circle_km(
        unit_vectors(np.array([20.0]), np.array([30.0]))[0], unit_vectors(np.array([20.0]), np.array([35.0]))[0]
    )
    assert table.error_km["model"][1] == pytest.approx(moved, rel=0.03)
    assert table.error_km["persistence"][1] == pytest.approx(2 * table.error_km["model"][1], rel=0.02)
    assert "model / hidden-grid spacing" in table.to_markdown()
    names = {f"eval/centroid_km/tracer/{k}/{h}" for k in ("model", "persistence") for h in ("006h", "012h")}
    assert set(table.metrics()) == names


def _on_ranks(group) -> list[float]:
    import torch.distributed as dist

    layout = ShardLayout(tuple(shard_sizes(GRID.n_points, dist.get_world_size(group))), dist.get_rank(group))
    table = _accumulate(slice(layout.start, layout.stop), [3.0, 7.0]).finalize(group, None)
    return table.error_km["model"] + table.error_km["persistence"]


def test_sharded_sums_give_one_ranks_errors(rank_pool):
    whole = _accumulate(slice(None), [3.0, 7.0]).finalize(None, None)
    expected = whole.error_km["model"] + whole.error_km["persistence"]
    for errors in rank_pool.run_ok(_on_ranks, 3):
        np.testing.assert_allclose(errors, expected, rtol=1e-12)


def test_a_faint_background_does_not_pull_the_centroid():
    """Values below the threshold (a forecast's smeared background) are not the plume."""
    xyz = unit_vectors(GRID.latitudes, GRID.longitudes)
    weights = point_set(GRID.latitudes, GRID.longitudes).area_weights()
    truth = _blob(30.0)
    hazy = truth.copy()
    hazy[:, 1] += 0.05 * ((GRID.longitudes > 90) & (GRID.longitudes < 270))  # the far hemisphere
    acc = CentroidAccumulator("tracer", 1, xyz, weights, [6.0], ("model",), threshold=0.1)
    acc.add("model", 0, hazy, truth, sample_id=0)
    assert acc.finalize(None, None).error_km["model"][0] < 0.1 * EARTH_RADIUS_KM * math.radians(1)
    plain = CentroidAccumulator("tracer", 1, xyz, weights, [6.0], ("model",))
    plain.add("model", 0, hazy, truth, sample_id=0)
    assert plain.finalize(None, None).error_km["model"][0] > 500  # without it: pulled far off
