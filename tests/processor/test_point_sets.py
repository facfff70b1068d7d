"""Grids from their coordinates: each kind recognised, its processor order and its areas."""

from __future__ import annotations

import numpy as np
import pytest

from processor.grids import gaussian_latitudes, get_grid
from processor.point_sets import hilbert_index, point_set

SPHERE = 4 * np.pi


def _shuffled(lat, lon, seed=0):
    perm = np.random.default_rng(seed).permutation(len(lat))
    return np.asarray(lat)[perm], np.asarray(lon)[perm]


@pytest.mark.parametrize("name, kind", [("o16", "octahedral"), ("f8", "regular_gaussian")])
def test_gaussian_grids_are_named_ordered_and_weighed_by_quadrature(name, kind):
    grid = get_grid(name)
    lat, lon = _shuffled(grid.latitudes, grid.longitudes - 360 * (grid.longitudes > 180))  # [-180, 180)
    found = point_set(lat, lon)
    assert (found.kind, found.name) == (kind, name)
    np.testing.assert_allclose(lat[found.order], grid.latitudes)
    np.testing.assert_allclose(lon[found.order] % 360, grid.longitudes, atol=1e-9)
    assert found.areas.sum() == pytest.approx(SPHERE, rel=1e-12)


def test_a_reduced_gaussian_grid_is_read_from_its_rings():
    lats, _ = gaussian_latitudes(8)
    counts = np.concatenate([np.arange(1, 9) * 6 + 12, (np.arange(1, 9) * 6 + 12)[::-1]])  # not octahedral
    lat = np.repeat(lats, counts)
    lon = np.concatenate([np.arange(n) * 360 / n for n in counts])
    found = point_set(*_shuffled(lat, lon))
    assert (found.kind, found.name) == ("reduced_gaussian", "n8")
    assert found.areas.sum() == pytest.approx(SPHERE, rel=1e-12)
    with pytest.raises(ValueError, match="n320 has 542080"):
        lats320, _ = gaussian_latitudes(320)
        point_set(np.repeat(lats320, 2), np.tile([0.0, 180.0], 640))


@pytest.mark.parametrize("poles", [True, False])
def test_regular_lat_lon_with_and_without_poles(poles):
    step = 2.5
    lats = np.arange(90, -90 - 1e-9, -step) if poles else np.arange(90 - step / 2, -90, -step)
    lat, lon = _shuffled(np.repeat(lats, 144), np.tile(np.arange(144) * step - 180, len(lats)))
    found = point_set(lat, lon)
    assert found.kind == "regular_latlon" and ("poles" in found.name) == poles
    assert found.areas.sum() == pytest.approx(SPHERE, rel=1e-12)
    equator = np.argmin(np.abs(lat[found.order] - lats[len(lats) // 2]))
    polar = 0  # the first ring: the north pole's, or the row nearest it
    assert found.areas[found.order[polar]] < found.areas[found.order[equator]]


def test_a_box_across_longitude_zero_is_ordered_in_rows_from_its_north_west_corner():
    lats, lons = np.arange(60, 39.99, -0.25), (np.arange(350, 370.001, 0.25)) % 360
    lat, lon = _shuffled(np.repeat(lats, len(lons)), np.tile(lons, len(lats)))
    found = point_set(lat, lon)
    assert found.kind == "regional_latlon"
    assert (lat[found.order[0]], lon[found.order[0]]) == (60, 350)
    assert (lat[found.order[len(lons)]], lon[found.order[len(lons) - 1]]) == (59.75, 10)
    s, n = np.sin(np.radians(39.875)), np.sin(np.radians(60.125))
    assert found.areas.sum() == pytest.approx(np.radians(20.25) * (n - s), rel=1e-9)  # edges half a step out


def _fibonacci(n):
    i = np.arange(n) + 0.5
    return np.degrees(np.arcsin(1 - 2 * i / n)), (np.degrees(np.pi * (1 + 5**0.5) * i)) % 360


def test_a_point_set_gets_a_hilbert_order_and_dual_areas():
    lat, lon = _fibonacci(3000)
    found = point_set(lat, lon)
    assert found.kind == "unstructured"
    assert found.areas.sum() == pytest.approx(SPHERE, rel=2e-3)  # planar triangles, slightly less
    xyz = np.stack(
        [
            np.cos(np.radians(lat)) * np.cos(np.radians(lon)),
            np.cos(np.radians(lat)) * np.sin(np.radians(lon)),
            np.sin(np.radians(lat)),
        ],
        1,
    )
    step = np.linalg.norm(np.diff(xyz[found.order], axis=0), axis=1)
    shuffled = np.linalg.norm(np.diff(xyz, axis=0), axis=1)
    assert np.median(step) < 0.1 * np.median(shuffled)  # neighbours in the order are near on the sphere


def test_a_regional_point_set_has_the_area_of_its_region():
    """A rotated 0.5-degree mesh over 20 x 20 degrees (as a projected regional grid is)."""
    a, b = np.meshgrid(np.radians(np.arange(-10, 10.001, 0.5)), np.radians(np.arange(-10, 10.001, 0.5)))
    x, y, z = np.ones_like(a), np.tan(a), np.tan(b)  # gnomonic around (0N, 0E), then tilted 50 degrees north
    t = np.radians(50)
    x, z = x * np.cos(t) - z * np.sin(t), x * np.sin(t) + z * np.cos(t)
    r = np.sqrt(x**2 + y**2 + z**2)
    lat, lon = np.degrees(np.arcsin(z / r)).ravel(), np.degrees(np.arctan2(y, x)).ravel()
    found = point_set(lat, lon)
    assert found.kind == "unstructured"
    corners = np.radians(10)
    region = 4 * np.arcsin(np.sin(corners) ** 2)  # the gnomonic square's solid angle
    assert found.areas.sum() == pytest.approx(region, rel=0.02)


def test_hilbert_index_is_a_bijection_on_a_lattice():
    g = np.stack(np.meshgrid(*[np.arange(4)] * 3, indexing="ij"), -1).reshape(-1, 3).astype(float)
    index = hilbert_index(g, bits=2)
    assert sorted(index) == list(range(64))
    path = g[np.argsort(index)]
    assert (np.abs(np.diff(path, axis=0)).sum(1) == 1).all()  # each step moves to a lattice neighbour


def test_bad_coordinates_are_refused():
    with pytest.raises(ValueError, match="share their coordinates"):
        point_set(np.array([0.0, 10.0, 10.0, 20.0]), np.array([0.0, 5.0, 5.0, 7.0]))
    with pytest.raises(ValueError, match=r"\[-90, 90\]"):
        point_set(np.array([0.0, 95.0, 10.0]), np.array([0.0, 1.0, 2.0]))


def test_octahedral_area_weights_integrate_over_the_sphere():
    """The mean of w * f over o16 is the sphere average of f, to quadrature's precision."""
    grid = get_grid("o16")
    weights = point_set(grid.latitudes, grid.longitudes).area_weights()
    lat, lon = np.radians(grid.latitudes), np.radians(grid.longitudes)
    fields = {
        "1": (np.ones_like(lat), 1.0),
        "sin^2 lat": (np.sin(lat) ** 2, 1 / 3),
        "1 + sin^2 lat cos^2 lon": (1 + np.sin(lat) ** 2 * np.cos(lon) ** 2, 1 + 1 / 6),
        "sin^4 lat": (np.sin(lat) ** 4, 1 / 5),
    }
    for name, (f, exact) in fields.items():
        assert abs(np.mean(weights * f) - exact) < 1e-12, name
    cos_lat = np.cos(lat) / np.cos(lat).mean()  # what plain cos(latitude) weights would give
    assert abs(np.mean(cos_lat * np.sin(lat) ** 2) - 1 / 3) > 0.05


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_coarsened_copies_keep_rows_and_span_a_box(stride):
    lats, lons = np.arange(60, 39.99, -0.5), np.arange(-10, 10.001, 0.5)  # 41 x 41
    lat, lon = np.repeat(lats, len(lons)), np.tile(lons, len(lats))
    found = point_set(lat, lon)
    kept = found.coarsened(stride)
    assert np.all(np.diff(kept) > 0)  # in processor order
    lat_k, lon_k = lat[found.order][kept], lon[found.order][kept]
    assert lat_k.max() == 60 and lat_k.min() == 40 and lon_k.min() == -10 and lon_k.max() == 10
    rows = len(range(0, 41, stride)) + (40 % stride != 0)
    assert len(kept) == rows**2
    grid = get_grid("o16")
    ring_grid = point_set(grid.latitudes, grid.longitudes)
    assert len(ring_grid.coarsened(stride)) == sum(len(range(0, n, stride)) for n in grid.points_per_ring[::stride])
    assert ring_grid.is_global and not found.is_global
