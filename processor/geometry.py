"""Geometry on the sphere, in one place for every package: positions as unit vectors, distances
along the Earth's surface, and the spacing of a grid."""

from __future__ import annotations

import math

import numpy as np

EARTH_RADIUS_KM = 6371.0  # the mean radius


def unit_vectors(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
    """``(*shape, 3)`` positions on the unit sphere of latitudes and longitudes (degrees) of any
    (the same) ``shape``."""
    lat, lon = np.radians(lat_deg), np.radians(lon_deg)
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1)


def great_circle_km(a: np.ndarray, b: np.ndarray) -> float:
    """The distance on the Earth between the directions of the vectors ``a`` and ``b`` (any length)."""
    return math.atan2(np.linalg.norm(np.cross(a, b)), float(a @ b)) * EARTH_RADIUS_KM


def grid_spacing_km(points: float) -> float:
    """The typical spacing of ``points`` evenly covering the sphere: ``sqrt(4 pi R^2 / points)``."""
    return math.sqrt(4 * math.pi / points) * EARTH_RADIUS_KM
