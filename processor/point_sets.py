"""Any grid from its coordinates: what kind it is, a 1-D point order, and each point's area.

:func:`point_set` takes a store's latitudes and longitudes (degrees, any order) and says:

- **kind**: ``octahedral`` (``oN``), ``regular_gaussian`` (``fN``), ``reduced_gaussian``
  (ECMWF's ``nN``: its rings read from the coordinates, its size checked against
  :data:`processor.grids.ECMWF_REDUCED_POINTS`), ``regular_latlon`` (global, with or without
  the poles), ``regional_latlon`` (a box of a lat-lon grid) or ``unstructured`` (anything
  else: a projected regional grid, a cut-out, any point set).
- **order**: for ring grids and boxes, rings (rows) from north to south, each from west to
  east (from longitude 0 on global rings, from the box's western edge in a box), so that a
  window of ``W`` points is a band of rows; for an unstructured set, the order of a Hilbert
  curve through the points' unit vectors (3-D), which keeps points that are close on the
  sphere close in the order (a window holds a compact patch, a rank's block a compact region:
  short halos).
- **areas** (steradians, one per point, in the store's order): ring grids, the band between
  the ring's edges over its points (Gaussian quadrature weights on Gaussian grids, which sum
  to the sphere exactly; half-way latitudes and the poles on lat-lon grids); boxes, each
  cell's band times its longitude width, the edge rows and columns half a spacing beyond the
  points; unstructured sets, a third of the area of each triangle of their Delaunay
  triangulation (on the sphere) that the point is a corner of.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import ConvexHull, Delaunay, cKDTree

from processor.geometry import unit_vectors
from processor.grids import ECMWF_REDUCED_POINTS, gaussian_latitudes

KINDS = ("octahedral", "regular_gaussian", "reduced_gaussian", "regular_latlon", "regional_latlon", "unstructured")
_LAT_DECIMALS = 6  # points on one ring share their latitude to 1e-6 degrees
_TOL_DEG = 1e-4  # equal spacing, to float32 coordinates' precision


@dataclass(frozen=True)
class PointSet:
    """A grid read from its coordinates (see the module's docstring).

    ``order[i]`` is the store index of the ``i``-th point in processor order; ``areas`` are in
    the store's order, steradians; ``name`` is the grid's usual name where it has one (``o96``,
    ``n320``, ``f48``), else a description. ``rows``: the points of each ring or box row, north
    to south, as they follow one another in processor order (None for an unstructured set);
    ``is_global``: whether the points cover the whole sphere."""

    kind: str
    name: str
    order: np.ndarray
    areas: np.ndarray
    rows: np.ndarray | None = None
    is_global: bool = True

    @property
    def n_points(self) -> int:
        return len(self.order)

    def coarsened(self, stride: int) -> np.ndarray:
        """Processor-order indices of a coarser copy of these points, in processor order: every
        ``stride``-th row and every ``stride``-th point of each kept row (rings and boxes;
        a box keeps its last row and column too, so the copy spans the whole domain), or every
        ``stride**2``-th point along the Hilbert curve (unstructured sets)."""
        if stride < 1:
            raise ValueError(f"a coarsening stride must be >= 1, got {stride}")
        if self.rows is None:
            return np.arange(0, self.n_points, stride**2)
        starts = np.concatenate([[0], np.cumsum(self.rows)[:-1]])
        keep_rows = _every(len(self.rows), stride, self.kind == "regional_latlon")
        picked = [starts[r] + _every(int(self.rows[r]), stride, self.kind == "regional_latlon") for r in keep_rows]
        return np.concatenate(picked)

    def area_weights(self) -> np.ndarray:
        """``areas`` normalised to mean 1, in the store's order (the skill's and the loss's weights)."""
        return self.areas / self.areas.mean()


@dataclass(frozen=True)
class _Ring:
    latitude: float
    points: np.ndarray  # store indices, west to east
    step: float  # longitude spacing (degrees); 0 for a single point
    start: float  # longitude of the first point, in [0, 360)

    @property
    def closed(self) -> bool:
        """Whether the ring goes all the way round (a single point at a pole does)."""
        if len(self.points) == 1:
            return abs(self.latitude) > 90 - 1e-6
        return abs(self.step * len(self.points) - 360.0) < _TOL_DEG * len(self.points)


def point_set(latitudes: np.ndarray, longitudes: np.ndarray) -> PointSet:
    """What the points at ``latitudes``, ``longitudes`` (degrees, ``(points,)``) are: their kind,
    processor order and areas. Raises ``ValueError`` for coordinates out of range or repeated."""
    lat, lon = _checked(latitudes, longitudes)
    rings = _rings(lat, lon)
    if rings is not None and all(r.closed for r in rings):
        return _global_rings(rings, len(lat))
    if rings is not None and _is_box(rings):
        return _box(rings, len(lat))
    return _unstructured(lat, lon)


def _checked(latitudes: np.ndarray, longitudes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lat = np.asarray(latitudes, dtype=np.float64).reshape(-1)
    lon = np.asarray(longitudes, dtype=np.float64).reshape(-1) % 360.0
    if lat.shape != lon.shape or len(lat) < 3:
        raise ValueError(f"need as many latitudes as longitudes, at least 3: got {lat.shape} and {lon.shape}")
    if not (np.isfinite(lat).all() and np.isfinite(lon).all()) or np.abs(lat).max() > 90 + _TOL_DEG:
        raise ValueError("latitudes must be finite degrees in [-90, 90] and longitudes finite degrees")
    return np.clip(lat, -90.0, 90.0), lon


def _rings(lat: np.ndarray, lon: np.ndarray) -> list[_Ring] | None:
    """Rows of equal latitude, north to south, each equally spaced in longitude; None when a
    row is not (then the points are no ring grid)."""
    keys = np.round(lat, _LAT_DECIMALS)
    rings = []
    for value in np.unique(keys)[::-1]:
        members = np.flatnonzero(keys == value)
        ring = _ring(float(value), members, lon[members])
        if ring is None:
            return None
        rings.append(ring)
    return rings


def _ring(latitude: float, members: np.ndarray, lon: np.ndarray) -> _Ring | None:
    if len(members) == 1:
        return _Ring(latitude, members, 0.0, float(lon[0]))
    order = np.argsort(lon, kind="stable")
    sorted_lon = lon[order]
    gaps = np.diff(np.concatenate([sorted_lon, [sorted_lon[0] + 360.0]]))
    step = float(np.median(gaps))
    if step <= 0:
        return None
    regular = np.abs(gaps - step) < _TOL_DEG
    if regular.all():  # a whole circle: start at the first point from longitude 0
        return _Ring(latitude, members[order], step, float(sorted_lon[0]))
    if (~regular).sum() != 1:
        return None
    cut = int(np.flatnonzero(~regular)[0])  # an arc: it starts after the one large gap
    rolled = np.roll(order, -(cut + 1))
    return _Ring(latitude, members[rolled], step, float(lon[rolled[0]]))


def _every(n: int, stride: int, with_last: bool) -> np.ndarray:
    """``0, stride, 2 stride, ...`` below ``n``, and ``n - 1`` too when ``with_last``."""
    picked = np.arange(0, n, stride)
    return np.append(picked, n - 1) if with_last and picked[-1] != n - 1 else picked


def _global_rings(rings: list[_Ring], n_points: int) -> PointSet:
    counts = np.array([len(r.points) for r in rings])
    lats = np.array([r.latitude for r in rings])
    order = np.concatenate([r.points for r in rings])
    gaussian = _gaussian_number(lats)
    if gaussian is not None:
        _, quadrature = gaussian_latitudes(gaussian)
        ring_area = 2 * np.pi * quadrature
        from_zero = all(min(r.start, 360.0 - r.start) < _TOL_DEG for r in rings)
        kind, name = _gaussian_kind(gaussian, counts, n_points, from_zero)
    else:
        edges = np.concatenate([[90.0], (lats[:-1] + lats[1:]) / 2, [-90.0]])
        ring_area = 2 * np.pi * (np.sin(np.radians(edges[:-1])) - np.sin(np.radians(edges[1:])))
        kind = "regular_latlon"
        poles = " with the poles" if abs(lats[0]) == 90 or abs(lats[-1]) == 90 else ""
        name = f"regular lat-lon {len(rings)} x {counts.max()}{poles}"
    areas = np.empty(n_points)
    areas[order] = np.repeat(ring_area / counts, counts)
    return PointSet(kind, name, order, areas, rows=counts)


def _gaussian_number(lats: np.ndarray) -> int | None:
    """``N`` when the ring latitudes are the 2N Gaussian latitudes, else None."""
    if len(lats) % 2:
        return None
    expected, _ = gaussian_latitudes(len(lats) // 2)
    return len(lats) // 2 if np.abs(expected - lats).max() < 1e-3 else None


def _gaussian_kind(n: int, counts: np.ndarray, n_points: int, from_zero: bool) -> tuple[str, str]:
    """``oN`` and ``fN`` have every ring start at longitude 0 (else: a reduced Gaussian grid)."""
    half = 4 * np.arange(1, n + 1) + 16
    if from_zero and np.array_equal(counts, np.concatenate([half, half[::-1]])):
        return "octahedral", f"o{n}"
    if from_zero and (counts == 4 * n).all():
        return "regular_gaussian", f"f{n}"
    known = ECMWF_REDUCED_POINTS.get(f"n{n}")
    if known is not None and known != n_points:
        raise ValueError(f"rings of n{n}'s latitudes but {n_points} points, where n{n} has {known}")
    return "reduced_gaussian", f"n{n}"


def _is_box(rings: list[_Ring]) -> bool:
    """Rows of one length, spacing and western edge, at equally spaced latitudes."""
    first = rings[0]
    same = all(
        len(r.points) == len(first.points)
        and abs(r.step - first.step) < _TOL_DEG
        and abs((r.start - first.start + 180) % 360 - 180) < _TOL_DEG
        for r in rings
    )
    lats = np.array([r.latitude for r in rings])
    return same and len(rings) > 1 and len(first.points) > 1 and np.ptp(np.diff(lats)) < _TOL_DEG


def _box(rings: list[_Ring], n_points: int) -> PointSet:
    lats = np.array([r.latitude for r in rings])
    half = abs(lats[1] - lats[0]) / 2
    edges = np.clip(np.concatenate([lats + half, [lats[-1] - half]]), -90.0, 90.0)
    band = np.sin(np.radians(edges[:-1])) - np.sin(np.radians(edges[1:]))
    width = np.radians(rings[0].step)
    order = np.concatenate([r.points for r in rings])
    areas = np.empty(n_points)
    areas[order] = np.repeat(band * width, len(rings[0].points))
    name = f"regional lat-lon {len(rings)} x {len(rings[0].points)} at {rings[0].step:g} degrees"
    rows = np.full(len(rings), len(rings[0].points))
    return PointSet("regional_latlon", name, order, areas, rows=rows, is_global=False)


def _unstructured(lat: np.ndarray, lon: np.ndarray) -> PointSet:
    xyz = unit_vectors(lat, lon)
    if len(np.unique(np.round(xyz, 9), axis=0)) < len(xyz):
        raise ValueError("two points share their coordinates: a point set needs distinct points")
    order = np.argsort(hilbert_index(xyz), kind="stable")
    is_global = _surrounds_origin(xyz)
    name = f"{len(lat)} points{'' if is_global else ', regional'}"
    return PointSet("unstructured", name, order, _dual_areas(xyz), is_global=is_global)


def _surrounds_origin(xyz: np.ndarray) -> bool:
    """Whether points on the unit sphere spread all round it (a global set), not over one part."""
    return bool(np.linalg.norm(xyz.mean(0)) < 0.5)


def _dual_areas(xyz: np.ndarray) -> np.ndarray:
    """A third of each adjacent triangle's area (planar triangles; steradians to second order):
    on the whole sphere, the triangles of the points' convex hull; on part of it, a Delaunay
    triangulation in the tangent plane at the points' mean direction."""
    centre = xyz.mean(0)
    if _surrounds_origin(xyz):  # the whole sphere
        triangles = ConvexHull(xyz).simplices
    else:
        normal = centre / np.linalg.norm(centre)
        u = np.cross(normal, [0.0, 0.0, 1.0] if abs(normal[2]) < 0.9 else [1.0, 0.0, 0.0])
        u /= np.linalg.norm(u)
        v = np.cross(normal, u)
        plane = xyz / (xyz @ normal)[:, None]  # gnomonic projection: great circles are lines
        flat = np.stack([plane @ u, plane @ v], axis=1)
        triangles = Delaunay(flat).simplices
        # Points along an edge of the region lie on one great circle, one line here: Qhull may
        # join them in flat slivers, which have no area in the plane but a chord's on the sphere.
        p, q, r = (flat[triangles[:, i]] for i in range(3))
        shadow = np.abs((q[:, 0] - p[:, 0]) * (r[:, 1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (r[:, 0] - p[:, 0]))
        triangles = triangles[shadow > 1e-6 * np.median(shadow)]
        triangles = _within_the_region(xyz, triangles)
    a, b, c = (xyz[triangles[:, i]] for i in range(3))
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    areas = np.zeros(len(xyz))
    for i in range(3):
        np.add.at(areas, triangles[:, i], area / 3)
    return areas


def _within_the_region(xyz: np.ndarray, triangles: np.ndarray, reach: float = 3.0) -> np.ndarray:
    """The triangles that tile the region itself: a Delaunay triangulation fills the points'
    convex hull, so a region whose edges curve inwards (a projected grid's rows are not great
    circles) gets triangles across the concavity, much longer than the spacing of the points at
    their corners. Kept: those whose longest edge is at most ``reach`` times the largest
    nearest-neighbour distance of their corners (a local spacing: stretched grids keep theirs)."""
    spacing = cKDTree(xyz).query(xyz, k=2)[0][:, 1]
    corners = [xyz[triangles[:, i]] for i in range(3)]
    longest = np.max([np.linalg.norm(corners[i] - corners[(i + 1) % 3], axis=1) for i in range(3)], axis=0)
    return triangles[longest <= reach * spacing[triangles].max(axis=1)]


def hilbert_index(xyz: np.ndarray, bits: int = 16) -> np.ndarray:
    """The position of each point ``(points, 3)`` (any real coordinates) along a 3-D Hilbert
    curve through their bounding box, ``bits`` levels deep (Skilling's transpose algorithm)."""
    lo, hi = xyz.min(0), xyz.max(0)
    scale = (2**bits - 1) / np.maximum(hi - lo, 1e-12)
    coords = ((xyz - lo) * scale).astype(np.int64).T.copy()  # (3, points)
    n = coords.shape[0]
    q = 1 << (bits - 1)
    while q > 1:  # inverse undo of the excess work
        p = q - 1
        for i in range(n):
            flip = (coords[i] & q) != 0
            coords[0] = np.where(flip, coords[0] ^ p, coords[0])
            t = np.where(flip, 0, (coords[0] ^ coords[i]) & p)
            coords[0] ^= t
            coords[i] ^= t
        q >>= 1
    for i in range(1, n):  # Gray encode
        coords[i] ^= coords[i - 1]
    t = np.zeros(coords.shape[1], dtype=np.int64)
    q = 1 << (bits - 1)
    while q > 1:
        t = np.where((coords[n - 1] & q) != 0, t ^ (q - 1), t)
        q >>= 1
    coords ^= t
    index = np.zeros(coords.shape[1], dtype=np.int64)
    for b in range(bits - 1, -1, -1):  # interleave the bits, most significant first
        for i in range(n):
            index = (index << 1) | ((coords[i] >> b) & 1)
    return index
