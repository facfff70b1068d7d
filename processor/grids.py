"""Gaussian grids of earth-system models and the 1-D point order the processor uses.

- Octahedral reduced Gaussian ``oN``: 2N rings; ring ``i`` (1..N from a pole) holds
  ``4 i + 16`` points, mirrored about the equator: ``4 N^2 + 36 N`` points.
- Regular Gaussian ``fN``: 2N rings of 4N points: ``8 N^2`` points.
- ECMWF's original reduced Gaussian ``nN``: ring lengths come from tables we do not ship;
  :data:`ECMWF_REDUCED_POINTS` gives their sizes, for sizing and benchmarks.

Latitudes are the Gaussian latitudes (roots of the Legendre polynomial ``P_2N``). Points
are ordered ring by ring from north to south and from west to east within a ring,
starting at longitude 0, so a window of ``W`` points is a band of about ``W / ring length``
rings around each point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: Points of ECMWF's original reduced Gaussian grids (``N320`` etc. in MARS), by name.
ECMWF_REDUCED_POINTS: dict[str, int] = {
    "n80": 35718,
    "n128": 88838,
    "n160": 138346,
    "n256": 348528,
    "n320": 542080,
    "n400": 843490,
    "n640": 2140702,
}


def gaussian_latitudes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes (degrees, north to south) and quadrature weights of the 2N-ring Gaussian grid."""
    if n < 1:
        raise ValueError(f"Gaussian grid number must be >= 1, got {n}")
    sin_lat, weights = np.polynomial.legendre.leggauss(2 * n)
    return np.degrees(np.arcsin(sin_lat))[::-1].copy(), weights[::-1].copy()


@dataclass(frozen=True)
class Grid:
    """A grid of rings: ``ring_latitudes[k]`` holds ``points_per_ring[k]`` equally spaced points."""

    name: str
    ring_latitudes: np.ndarray
    points_per_ring: np.ndarray

    @property
    def n_points(self) -> int:
        return int(self.points_per_ring.sum())

    @property
    def n_rings(self) -> int:
        return len(self.points_per_ring)

    @cached_property
    def ring_offsets(self) -> np.ndarray:
        """Index of each ring's first point in the processor's order, ``(n_rings,)``."""
        return np.concatenate([[0], np.cumsum(self.points_per_ring)[:-1]])

    @cached_property
    def latitudes(self) -> np.ndarray:
        """``(points,)`` degrees north, in processor order."""
        return np.repeat(self.ring_latitudes, self.points_per_ring)

    @cached_property
    def longitudes(self) -> np.ndarray:
        """``(points,)`` degrees east in [0, 360), in processor order."""
        return np.concatenate([np.arange(n) * (360.0 / n) for n in self.points_per_ring])

    def coordinates(self) -> np.ndarray:
        """``(points, 2)`` latitude and longitude in degrees, in processor order."""
        return np.stack([self.latitudes, self.longitudes], axis=1)


def octahedral_grid(n: int) -> Grid:
    """The octahedral reduced Gaussian grid ``oN``."""
    lats, _ = gaussian_latitudes(n)
    half = 4 * np.arange(1, n + 1) + 16
    return Grid(f"o{n}", lats, np.concatenate([half, half[::-1]]))


def regular_gaussian_grid(n: int) -> Grid:
    """The regular (full) Gaussian grid ``fN``."""
    lats, _ = gaussian_latitudes(n)
    return Grid(f"f{n}", lats, np.full(2 * n, 4 * n))


_NAME = re.compile(r"^([ofn])(\d+)$")


def _parse(name: str) -> tuple[str, int]:
    match = _NAME.match(name.strip().lower())
    if not match:
        raise ValueError(
            f"unknown grid {name!r}: expected oN (octahedral), fN (regular Gaussian) or nN (ECMWF reduced)"
        )
    return match.group(1), int(match.group(2))


def grid_points(name: str) -> int:
    """Points of the grid called ``name`` (``o96``, ``f48``, ``n320``, ...), without building it."""
    kind, n = _parse(name)
    if kind == "o":
        return 4 * n * n + 36 * n
    if kind == "f":
        return 8 * n * n
    key = f"n{n}"
    if key not in ECMWF_REDUCED_POINTS:
        raise ValueError(f"no point count for {name!r}; known reduced grids: {sorted(ECMWF_REDUCED_POINTS)}")
    return ECMWF_REDUCED_POINTS[key]


def get_grid(name: str) -> Grid:
    """The grid called ``name``: ``oN`` or ``fN`` (``nN`` has no ring table here: use
    :func:`grid_points` for its size)."""
    kind, n = _parse(name)
    if kind == "o":
        return octahedral_grid(n)
    if kind == "f":
        return regular_gaussian_grid(n)
    raise ValueError(
        f"grid {name!r} is an ECMWF original reduced grid whose ring table is not bundled; "
        f"it has {grid_points(name)} points (grid_points); use an oN or fN grid for coordinates"
    )
