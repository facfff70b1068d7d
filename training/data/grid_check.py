"""Which grid a dataset is on: inferred from the store (``data.grid: null``) or checked against
the named one, by coordinates, not only by point count. Any point set is a grid training reads
(:mod:`processor.point_sets`); ``oN``/``fN`` grids are also checked against
:mod:`processor.grids`' tables point by point."""

from __future__ import annotations

import logging
import math
import re

import numpy as np

from processor.grids import ECMWF_REDUCED_POINTS, get_grid, grid_points
from processor.point_sets import PointSet
from training.data.dataset import DatasetError

log = logging.getLogger(__name__)

TOLERANCE_DEG = 1e-3  # float32 coordinates (netCDF) are good to ~1e-5 degrees


def _coordinates_error(latitudes: np.ndarray, longitudes: np.ndarray, name: str) -> str | None:
    """Why ``(points,)`` coordinates in degrees are not the grid ``name`` (None: they are).

    The points may come in another order than the processor's (ring by ring from the north,
    west to east from longitude 0); longitudes are compared modulo 360.
    """
    grid = get_grid(name)
    if len(latitudes) != grid.n_points:
        return f"{name} has {grid.n_points} points but the dataset has {len(latitudes)}"
    ref = np.stack([grid.latitudes, grid.longitudes % 360.0], axis=1)
    got = np.stack([latitudes, np.asarray(longitudes) % 360.0], axis=1)
    if _max_distance(got, ref) <= TOLERANCE_DEG:
        return None
    order_ref, order_got = (np.lexsort((np.round(c[:, 1], 2), np.round(c[:, 0], 2))) for c in (ref, got))
    if _max_distance(got[order_got], ref[order_ref]) <= TOLERANCE_DEG:
        log.info("the dataset's points are those of %s in another order", name)
        return None
    worst = int(np.argmax(_distances(got, ref)))
    return (
        f"its coordinates are not those of {name} (point {worst}: latitude/longitude "
        f"({got[worst, 0]:.4f}, {got[worst, 1]:.4f}) where {name} has ({ref[worst, 0]:.4f}, {ref[worst, 1]:.4f}))"
    )


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per point ``max(|dlat|, |dlon| mod 360)`` in degrees of ``(points, 2)`` coordinate pairs."""
    dlat = np.abs(a[:, 0] - b[:, 0])
    dlon = np.abs((a[:, 1] - b[:, 1] + 180.0) % 360.0 - 180.0)
    dlon = np.where(np.abs(a[:, 0]) > 89.999, 0.0, dlon)  # at a pole every longitude is the same point
    return np.maximum(dlat, dlon)


def _max_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(_distances(a, b).max(initial=0.0))


def _candidates(resolution: str | None, n_points: int) -> list[str]:
    """Grid names to try: the store's ``resolution`` first, then the oN and fN grids of that size."""
    names = []
    if resolution and re.fullmatch(r"[ofOF]\d+", str(resolution).strip()):
        names.append(str(resolution).strip().lower())
    n_octahedral = (-36 + math.isqrt(1296 + 16 * n_points)) // 8
    if n_octahedral > 0 and 4 * n_octahedral**2 + 36 * n_octahedral == n_points:
        names.append(f"o{n_octahedral}")
    n_regular = math.isqrt(n_points // 8)
    if n_regular > 0 and 8 * n_regular**2 == n_points:
        names.append(f"f{n_regular}")
    return list(dict.fromkeys(names))


def check_grid(points: PointSet, latitudes: np.ndarray, longitudes: np.ndarray, name: str, where: str) -> None:
    """Raise ``DatasetError`` naming ``data.grid`` if the dataset at ``where`` (its grid ``points``
    read from its coordinates, degrees ``(points,)``) is not on the grid ``name``: an ``oN``/``fN``
    grid (checked point by point), an ``nN`` grid (by its rings), or the name
    :func:`infer_grid` gave another kind (a resumed run's record)."""
    key = name.strip().lower()
    if re.fullmatch(r"[of]\d+", key):
        expected = grid_points(key)
        if len(latitudes) != expected:
            raise DatasetError(f"data.grid = {name} has {expected} points but {where} has {len(latitudes)}")
        problem = _coordinates_error(latitudes, longitudes, key)
        if problem:
            raise DatasetError(
                f"data.grid = {name} does not fit {where}: {problem}; set data.grid to its grid, or null"
            )
        return
    if re.fullmatch(r"n\d+", key):
        expected = ECMWF_REDUCED_POINTS.get(key)
        if expected is not None and len(latitudes) != expected:
            raise DatasetError(f"data.grid = {name} has {expected} points but {where} has {len(latitudes)}")
        if points.name != key:
            raise DatasetError(f"data.grid = {name} does not fit {where}: its rings are those of {points.name}")
        return
    if name.strip() != points.name:
        raise DatasetError(
            f"data.grid = {name!r} does not fit {where}: its coordinates are {points.name!r}; "
            "set data.grid to that, or null to have it read from the store"
        )


def infer_grid(points: PointSet, latitudes: np.ndarray, longitudes: np.ndarray, resolution: str | None) -> str:
    """The name of the grid the dataset is on: an ``oN``/``fN`` grid of :mod:`processor.grids`
    whose coordinates it has (its ``resolution`` attribute tried first), else the name
    :func:`processor.point_sets.point_set` gave its coordinates (``n320``, ``regular lat-lon 61
    x 120 with the poles``, ``regional lat-lon 81 x 81 at 0.25 degrees``, ``5000 points``)."""
    for name in _candidates(resolution, len(latitudes)):
        if _coordinates_error(latitudes, longitudes, name) is None:
            return name
    return points.name
