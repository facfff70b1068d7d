"""Where a forecast map looks: the whole globe for a global grid, the domain's box for a regional
one, and the raster of grid cells the map's panels show.

A grid is regional when its longitudes leave a gap of at least :data:`GLOBAL_GAP_DEG` around
the globe; its box is then drawn in a longitude frame that starts at the domain's western edge,
so a box across longitude 0 (-10..2) or across the antimeridian (170..190) is one contiguous
extent, with half a cell of margin all round so the edge cells are whole, on a longitude-latitude
axis whose aspect (``1 / cos(mean latitude)``) keeps distances."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from processor.geometry import unit_vectors

GLOBAL_GAP_DEG = 60.0  # longitudes that leave no gap this wide go round the globe
_MAX_CELLS = 1200  # at most this many raster rows or columns on a regional map
_MAX_ASPECT_LAT = 80.0  # the aspect of a box nearer a pole than this stays that of 80 degrees


@dataclass(frozen=True)
class MapFrame:
    """The longitude-latitude box a map shows (degrees east and north; ``west < east``, ``east``
    may pass 180 for a box across the antimeridian) and the cell size of its raster (degrees)."""

    west: float
    east: float
    south: float
    north: float
    dlon: float
    dlat: float
    regional: bool
    reach: float = 0.99  # a regional raster's cells further than this many cells from a point are empty

    @property
    def extent(self) -> tuple[float, float, float, float]:
        """``(west, east, south, north)``: ``imshow``'s extent and the axes' limits."""
        return self.west, self.east, self.south, self.north

    @property
    def aspect(self) -> float:
        """Display height of a degree of latitude over that of a degree of longitude: ``1 /
        cos(mean latitude)`` for a regional box (distances kept at its middle), 1 for the globe."""
        if not self.regional:
            return 1.0
        mid = min(abs(self.south + self.north) / 2, _MAX_ASPECT_LAT)
        return float(1 / np.cos(np.radians(mid)))

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)`` of the raster."""
        return round((self.north - self.south) / self.dlat), round((self.east - self.west) / self.dlon)

    def centres(self) -> tuple[np.ndarray, np.ndarray]:
        """The raster cells' centres: latitudes ``(rows,)`` north to south, longitudes
        ``(columns,)`` west to east, in the frame's longitudes."""
        rows, cols = self.shape
        return self.north - (np.arange(rows) + 0.5) * self.dlat, self.west + (np.arange(cols) + 0.5) * self.dlon

    def height_over_width(self) -> float:
        """The map's displayed height over its width (0.5 for the globe)."""
        return (self.north - self.south) * self.aspect / (self.east - self.west)


def _west_edge(lon: np.ndarray) -> float | None:
    """The domain's westernmost longitude in [-180, 180): the point east of the widest gap
    between the points' longitudes ``(points,)``; None when no gap is :data:`GLOBAL_GAP_DEG` wide."""
    u = np.unique(np.mod(lon, 360.0))
    gaps = np.diff(np.append(u, u[0] + 360.0))
    widest = int(np.argmax(gaps))
    if gaps[widest] < GLOBAL_GAP_DEG:
        return None
    return float((u[(widest + 1) % len(u)] + 180.0) % 360.0 - 180.0)


def frame_longitudes(lon: np.ndarray, west: float) -> np.ndarray:
    """Longitudes ``(points,)`` (degrees, any frame) moved by whole turns into ``[west, west + 360)``."""
    return west + np.mod(np.asarray(lon, dtype=np.float64) - west + 1e-9, 360.0) - 1e-9


def _median_step(values: np.ndarray) -> float:
    """The median spacing of the distinct ``values`` ``(n,)`` (rounded to 1e-6 degrees); 0 when
    there is one."""
    steps = np.diff(np.unique(np.round(values, 6)))
    return float(np.median(steps)) if len(steps) else 0.0


def _on_lattice(values: np.ndarray, step: float) -> bool:
    """Whether ``values`` ``(n,)`` are all a whole number of ``step`` from their minimum (to 1%)."""
    units = (values - values.min()) / step
    return bool(np.all(np.abs(units - np.round(units)) < 0.01))


def _cells(lat: np.ndarray, lon: np.ndarray) -> tuple[float, float, float]:
    """``(dlat, dlon, reach)`` cell size (degrees) of a regional grid's points ``(points,)``
    and how many cells away a point still fills a cell: its rows' and columns' spacing for
    points of a latitude-longitude grid (a box, or part of one, with at least a quarter of the
    box's nodes; reach just under 1, a cell per point), else the spacing of as many points
    spread evenly over the box (reach 1.5: the gaps between scattered points are uneven)."""
    dlat, dlon = _median_step(lat), _median_step(lon)
    if dlat and dlon and _on_lattice(lat, dlat) and _on_lattice(lon, dlon):
        if (np.ptp(lat) / dlat + 1) * (np.ptp(lon) / dlon + 1) <= 4 * len(lat):
            return dlat, dlon, 0.99
    coslat = max(float(np.cos(np.radians(np.mean(lat)))), 0.05)
    step = float(np.sqrt(max(np.ptp(lat), 0.1) * max(np.ptp(lon), 0.1) * coslat / len(lat)))
    return step, step / coslat, 1.5


def map_frame(lat: np.ndarray, lon: np.ndarray) -> MapFrame:
    """The frame of a map of a grid's points (``lat``, ``lon`` ``(points,)``, degrees): the
    globe (longitudes -180..180, or 0..360 when none is negative; latitudes -90..90) when the
    longitudes go round it, else the points' box plus half a cell on every side."""
    lat, lon = np.asarray(lat, dtype=np.float64).ravel(), np.asarray(lon, dtype=np.float64).ravel()
    west = _west_edge(lon)
    if west is None:
        rows = int(np.clip(round(2 * np.sqrt(len(lat) / 2)), 90, 360))
        start = -180.0 if float(np.min(lon)) < 0 else 0.0
        return MapFrame(start, start + 360.0, -90.0, 90.0, 180.0 / rows, 180.0 / rows, regional=False)
    lon = frame_longitudes(lon, west)
    dlat, dlon, reach = _cells(lat, lon)
    dlat, dlon = max(dlat, np.ptp(lat) / _MAX_CELLS), max(dlon, np.ptp(lon) / _MAX_CELLS)
    south, north = max(float(lat.min()) - dlat / 2, -90.0), min(float(lat.max()) + dlat / 2, 90.0)
    rows = max(round((north - south) / dlat), 1)
    west, east = float(lon.min()) - dlon / 2, float(lon.max()) + dlon / 2
    return MapFrame(west, east, south, north, dlon, (north - south) / rows, regional=True, reach=reach)


def raster(lat: np.ndarray, lon: np.ndarray, frame: MapFrame) -> np.ndarray:
    """``(rows, columns)`` index of the grid point (of ``lat``, ``lon`` ``(points,)``) nearest
    each cell of ``frame``'s raster (on the sphere); on a regional map, -1 where that point is
    ``frame.reach`` cells or more away in latitude or longitude (no point there). Each point's value fills the
    cells nearest it: the field as the model sees it, not interpolated; on a latitude-longitude
    box each cell is one point."""
    from scipy.spatial import cKDTree  # deferred: scipy (0.3 s), maps only

    lat, lon = np.asarray(lat, dtype=np.float64).ravel(), np.asarray(lon, dtype=np.float64).ravel()
    lat_c, lon_c = frame.centres()
    glon, glat = np.meshgrid(lon_c, lat_c)
    _, nearest = cKDTree(unit_vectors(lat, lon)).query(unit_vectors(glat, glon).reshape(-1, 3))
    nearest = nearest.reshape(glat.shape)
    if frame.regional:
        near_lat = np.abs(lat[nearest] - glat) < frame.reach * frame.dlat
        near_lon = np.abs(frame_longitudes(lon, frame.west)[nearest] - glon) < frame.reach * frame.dlon
        nearest = np.where(near_lat & near_lon, nearest, -1)
    return nearest
