"""The scale probe's pick of the largest grid that fits."""

import pytest


def test_scale_probe_picks_the_largest_grid_under_the_budget():
    from benchmarks.scale_probe import largest_fitting
    from processor.grids import grid_points

    samples = {1000: 100 + 1000, 2000: 100 + 2000}  # bytes = 100 + N
    grid = largest_fitting(samples, budget=100 + 40320, family="o", step=8, global_attention=False)
    assert grid_points(grid) <= 40320 < grid_points(f"o{int(grid[1:]) + 8}")
    assert grid == "o96"
    smaller = largest_fitting(samples, 100 + 40320, "o", 8, False, below=40320)
    assert smaller == "o88"


def test_scale_probe_refuses_a_fit_without_growth():
    from benchmarks.scale_probe import largest_fitting

    with pytest.raises(ValueError, match="larger probe.fit_grids"):
        largest_fitting({1000: 500, 2000: 490}, budget=10_000, family="o", step=8, global_attention=False)
