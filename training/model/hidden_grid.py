"""The processor's grid (``model.hidden_grid``), as anemoi's graphs allow:

- ``oN``: a global octahedral reduced Gaussian grid (the default for global data), whatever
  grid the data is on; the encoder and decoder graphs connect the two.
- ``data``: the data's own points, in processor order; with ``model.hidden_stride = k`` a
  coarsened copy of them (every k-th row and every k-th point of a kept row, a box keeping its
  edges; every k²-th point along an unstructured set's Hilbert curve). The choice for a regional
  domain, where a global grid would put nearly every hidden point where there is no data.

The hidden points' order is the processor's 1-D order: the sliding window and the ranks'
contiguous blocks follow it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from processor.geometry import grid_spacing_km
from processor.grids import get_grid
from processor.point_sets import PointSet
from training.config.checks import DATA, check_hidden_grid
from training.config.settings import ConfigValueError


@dataclass(frozen=True)
class HiddenGrid:
    """The hidden points ``(points,)`` in degrees, in processor order, and the area they cover
    (steradians)."""

    name: str
    latitudes: np.ndarray
    longitudes: np.ndarray
    area_sr: float

    @property
    def n_points(self) -> int:
        return len(self.latitudes)

    @property
    def spacing_km(self) -> float:
        """The typical distance between neighbouring hidden points: ``sqrt(area / points)``."""
        return grid_spacing_km(self.n_points * 4 * math.pi / self.area_sr)


def hidden_grid(name: str, stride: int, data: PointSet, data_lat: np.ndarray, data_lon: np.ndarray) -> HiddenGrid:
    """The hidden grid ``name`` (``oN`` or ``data``; see the module) for data whose points are
    ``data`` (read from its coordinates) at ``data_lat``, ``data_lon`` (degrees, processor
    order). A global ``oN`` over data that covers part of the sphere raises ``ConfigValueError``."""
    check_hidden_grid(name, stride)
    if name == DATA:
        kept = data.coarsened(stride)
        label = DATA if stride == 1 else f"data every {stride}"
        return HiddenGrid(label, data_lat[kept], data_lon[kept], float(data.areas.sum()))
    if not data.is_global:
        raise ConfigValueError(
            f"model.hidden_grid = {name} is a global grid but the data covers part of the sphere "
            f"({data.name}): set model.hidden_grid=data (model.hidden_stride=2 or more to coarsen it)"
        )
    grid = get_grid(name)
    return HiddenGrid(name, grid.latitudes, grid.longitudes, 4 * math.pi)
