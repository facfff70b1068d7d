"""``evaluate.area``: the box a run is scored on, ``[north, west, south, east]`` in degrees, when
the model runs on a larger domain than the region of interest (a limited area inside what brings
its weather, as anemoi's limited-area models are scored on their inner region)."""

from __future__ import annotations

import numpy as np

from training.config.settings import ConfigValueError
from training.session import Session


def in_area(area: list[float] | None, latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """``(points,)`` whether each point (degrees) lies in ``area`` (all of them when None); a
    ``west`` east of ``east`` crosses the antimeridian."""
    if area is None:
        return np.ones(len(latitudes), dtype=bool)
    north, west, south, east = (float(v) for v in area)
    inside_lat = (latitudes >= south) & (latitudes <= north)
    span = (east - west) % 360
    if span == 0 and east != west:  # [.., -180, .., 180]: every longitude
        span = 360.0
    inside_lon = (np.asarray(longitudes) - west) % 360 <= span
    return inside_lat & inside_lon


def check_area(area: list[float] | None, latitudes: np.ndarray, longitudes: np.ndarray) -> None:
    """A :class:`ConfigValueError` naming ``evaluate.area`` when it holds none of the points."""
    if area is None or in_area(area, latitudes, longitudes).any():
        return
    raise ConfigValueError(
        f"config key evaluate.area = {list(area)} holds none of the data's {len(latitudes)} points (latitudes "
        f"{latitudes.min():.2f} to {latitudes.max():.2f}, longitudes {longitudes.min():.2f} to "
        f"{longitudes.max():.2f}): give [north, west, south, east] of a box inside the data, or null to score "
        "every point"
    )


def scored_weights(session: Session) -> np.ndarray:
    """``(local points,)`` the area weights of ``session``'s rank's points inside its
    ``evaluate.area``, zero outside: what its scores weigh."""
    dataset, points, area = session.dataset, session.points, session.cfg.evaluate.area
    if area is None:
        return dataset.area_weights[points]
    inside = in_area(area, dataset.latitudes[points], dataset.longitudes[points])
    return np.where(inside, dataset.area_weights[points], 0.0)
