"""Geometry on the sphere, worked by hand."""

import math

import numpy as np

from processor.geometry import EARTH_RADIUS_KM, great_circle_km, grid_spacing_km, unit_vectors


def test_unit_vectors_of_the_poles_the_equator_and_any_shape():
    poles_and_equator = unit_vectors(np.array([90.0, 0.0]), np.array([0.0, 90.0]))
    np.testing.assert_allclose(poles_and_equator, [[0, 0, 1], [0, 1, 0]], atol=1e-15)
    assert unit_vectors(np.zeros((2, 3)), np.zeros((2, 3))).shape == (2, 3, 3)


def test_a_quarter_of_a_great_circle_and_the_spacing_of_one_point_per_steradian():
    a, b = unit_vectors(np.array(0.0), np.array(0.0)), unit_vectors(np.array(0.0), np.array(90.0))
    assert math.isclose(great_circle_km(a, 2 * b), math.pi / 2 * EARTH_RADIUS_KM)  # the length does not count
    assert math.isclose(grid_spacing_km(4 * math.pi), EARTH_RADIUS_KM)
