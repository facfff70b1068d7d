"""The forecast map's frame: a regional domain's box (also across longitude 0 and the
antimeridian), its cells and an aspect that keeps distances; the globe for a global grid."""

from __future__ import annotations

import numpy as np
import pytest

import training.reporting.plots as plots
from training.reporting.map_frame import map_frame, raster


def _box(south: float, north: float, west: float, east: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """``(lat, lon)`` ``(points,)`` of a regular box, rows north to south, longitudes in [0, 360)."""
    lats = np.arange(north, south - step / 2, -step)
    lons = np.arange(west, east + step / 2, step)
    return np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360


def _figure(lat: np.ndarray, lon: np.ndarray):
    """The forecast map of one field on the points, and its map axes (those with an image)."""
    truth = np.cos(np.radians(lat)) * np.sin(np.radians(lon))
    fig = plots.forecast_map_figure(lat, lon, truth, truth + 0.1, ["2t"], lead_hours=6, units={"2t": "K"})
    return fig, [ax for ax in fig.axes if ax.images]


@pytest.mark.parametrize(
    ("west", "east", "box"),
    [
        (-10.0, 2.0, (-10.125, 2.125)),  # the UK: across longitude 0
        (170.0, 190.0, (169.875, 190.125)),  # across the antimeridian: 170..-170
        (5.0, 17.0, (4.875, 17.125)),  # east of 0 only
    ],
)
def test_a_regional_box_is_shown_whole_with_half_a_cell_round_it(west, east, box):
    lat, lon = _box(50.0, 58.0, west, east, 0.25)  # 33 x 49 (x 81) points
    fig, maps = _figure(lat, lon)
    assert len(maps) == 3
    for ax in maps:
        assert ax.get_xlim() == pytest.approx(box)
        assert ax.get_ylim() == pytest.approx((49.875, 58.125))
        assert ax.get_aspect() == pytest.approx(1 / np.cos(np.radians(54.0)))
        assert "degrees east" in maps[0].get_xlabel() and "degrees north" in maps[0].get_ylabel()
    assert all(maps[0].get_shared_x_axes().joined(maps[0], ax) for ax in maps[1:])  # one zoom for all
    image = maps[0].images[0]
    assert image.get_array().shape == (33, round((east - west) / 0.25) + 1)  # a pixel per grid point
    assert image.get_extent() == pytest.approx([*box, 49.875, 58.125])
    plots.plt.close(fig)


def test_a_regional_box_s_pixels_are_its_points():
    lat, lon = _box(50.0, 58.0, -10.0, 2.0, 0.25)
    frame = map_frame(lat, lon)
    nearest = raster(lat, lon, frame)
    assert nearest.shape == (33, 49)
    np.testing.assert_array_equal(nearest.ravel(), np.arange(len(lat)))  # rows north to south as stored
    assert frame.regional and (nearest >= 0).all()


def test_cells_of_a_regional_raster_far_from_every_point_are_left_empty():
    lat, lon = _box(50.0, 58.0, -10.0, 2.0, 0.25)
    keep = ~((lat > 54) & (lon > 180))  # an L-shaped domain: no north-west quarter
    nearest = raster(lat[keep], lon[keep], map_frame(lat[keep], lon[keep]))
    assert nearest.shape == (33, 49)
    assert (nearest[:16, :40] == -1).all() and (nearest[17:] >= 0).all()


def test_a_global_grid_still_shows_the_globe():
    rng = np.random.default_rng(0)
    lat, lon = np.degrees(np.arcsin(rng.uniform(-1, 1, 800))), rng.uniform(0, 360, 800)
    fig, maps = _figure(lat, lon)
    for ax in maps:
        assert ax.get_xlim() == pytest.approx((0.0, 360.0))
        assert ax.get_ylim() == pytest.approx((-90.0, 90.0))
        assert ax.get_aspect() == pytest.approx(1.0)
    plots.plt.close(fig)
    frame = map_frame(lat, lon - 180.0)
    assert not frame.regional and frame.extent == (-180.0, 180.0, -90.0, 90.0)


def test_a_regular_global_grid_is_global_not_a_box():
    lat, lon = _box(-90.0, 90.0, 0.0, 357.5, 2.5)
    frame = map_frame(lat, lon)
    assert not frame.regional and frame.extent == (0.0, 360.0, -90.0, 90.0)
