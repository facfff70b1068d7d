import numpy as np
import pytest

from processor.grids import ECMWF_REDUCED_POINTS, gaussian_latitudes, get_grid, grid_points


@pytest.mark.parametrize(
    "name,points",
    [
        ("o32", 5248),
        ("o48", 10944),
        ("o96", 40320),
        ("o320", 421120),
        ("o1280", 6599680),
        ("f48", 18432),
        ("n320", 542080),
    ],
)
def test_point_counts(name, points):
    assert grid_points(name) == points


@pytest.mark.parametrize("name", ["o32", "o96", "f16"])
def test_built_grid_agrees_with_count_and_order(name):
    grid = get_grid(name)
    assert grid.n_points == grid_points(name) == len(grid.latitudes) == len(grid.longitudes)
    assert np.all(np.diff(grid.ring_latitudes) < 0)  # north to south
    first_ring = grid.longitudes[: grid.points_per_ring[0]]
    assert first_ring[0] == 0 and np.all(np.diff(first_ring) > 0)  # west to east from Greenwich
    np.testing.assert_allclose(grid.ring_latitudes, -grid.ring_latitudes[::-1])  # symmetric


def test_octahedral_rings():
    grid = get_grid("o96")
    assert grid.points_per_ring[0] == 20 and grid.points_per_ring[95] == 400 == grid.points_per_ring[96]


def test_gaussian_latitudes_integrate_polynomials():
    lats, weights = gaussian_latitudes(8)
    mu = np.sin(np.radians(lats))
    assert weights.sum() == pytest.approx(2.0)
    assert (weights * mu**2).sum() == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["x96", "o", "n999"])
def test_unknown_grids(name):
    with pytest.raises(ValueError):
        grid_points(name)


def test_reduced_grid_without_table_names_its_size():
    with pytest.raises(ValueError, match="542080"):
        get_grid("n320")
    assert ECMWF_REDUCED_POINTS["n320"] == 542080
