"""A synthetic hourly 2 m temperature store over a regional box, written in the anemoi-datasets
layout: the data of a limited-area model's user, where no real reanalysis can be reached.

Synthetic, and said so in its attributes. Its 2 m temperature (K) is built from what makes the
real one hard to forecast:

- a **daily cycle** that follows the sun (warmest about 15 h local solar time, from the
  points' longitudes), 6 K over land and 1 K over the sea, damped under cloud;
- **weather**: anomalies of a few K carried eastwards by travelling waves of 1000 to 3000 km
  at 5 to 15 m/s, whose crests bring cloud (a smaller daily cycle), entering the box from its
  western edge;
- a **seasonal** warming through the period and a north–south gradient;
- **static fields**: the land-sea mask ``lsm`` and orography ``z`` (geopotential, m² s⁻²),
  with a lapse rate of 6.5 K/km, stored as variables (constant in time) to be given as
  forcings;
- **noise**: a first-order autoregressive part at each point (0.4 K, an hour's correlation
  0.8), which no forecast can predict.

``python -m training data=regional_t2m`` writes it on first use and trains on it 6-hourly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from processor.geometry import EARTH_RADIUS_KM
from training.data.anemoi_layout import write_anemoi_store

VARIABLES = ["2t", "lsm", "z"]
EARTH_RADIUS_M = EARTH_RADIUS_KM * 1e3
G = 9.80665
START = np.datetime64("2021-05-01T00:00:00", "s")


def box_points(north: float = 60.0, south: float = 40.0, west: float = -10.0, east: float = 10.0, step: float = 0.5):
    """``(latitudes, longitudes)`` of a regular box, rows north to south, west to east (degrees)."""
    lats, lons = np.arange(north, south - step / 2, -step), np.arange(west, east + step / 2, step)
    return np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360


def _static_fields(lat: np.ndarray, lon: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Land-sea mask (sea to the west and north-west, a wavy coast) and orography (m) on land."""
    lon_e = (lon + 180) % 360 - 180
    coast = -4.0 + 2.5 * np.sin(np.radians(lat) * 9.0 + rng.uniform(0, 2 * np.pi)) + 0.25 * (lat - 50)
    land = (lon_e > coast).astype(np.float32)
    height = np.zeros_like(lat)
    for _ in range(3):  # mountain ranges
        c_lat, c_lon = rng.uniform(42, 56), rng.uniform(-2, 9)
        height += rng.uniform(600, 1800) * np.exp(-(((lat - c_lat) / 1.5) ** 2 + ((lon_e - c_lon) / 2.5) ** 2))
    return land, height * land


def _waves(rng: np.random.Generator, count: int = 5) -> list[dict[str, float]]:
    """Travelling waves: wavelength (m), direction, eastward-ish speed (m/s), amplitude (K), phase."""
    return [
        {
            "wavelength": rng.uniform(1.0e6, 3.0e6),
            "angle": rng.uniform(-0.5, 0.5),  # radians from due east
            "speed": rng.uniform(5.0, 15.0),
            "amplitude": rng.uniform(1.5, 3.5),
            "phase": rng.uniform(0, 2 * np.pi),
            "period_days": rng.uniform(6.0, 20.0),  # of a slow change of its amplitude
        }
        for _ in range(count)
    ]


def _weather(
    x: np.ndarray, y: np.ndarray, seconds: float, waves: list[dict[str, float]]
) -> tuple[np.ndarray, np.ndarray]:
    """``(anomaly K, cloud in [0, 1])`` at the points ``x``, ``y`` (m) after ``seconds``."""
    anomaly = np.zeros_like(x)
    for w in waves:
        k = 2 * np.pi / w["wavelength"]
        along = x * np.cos(w["angle"]) + y * np.sin(w["angle"]) - w["speed"] * seconds
        envelope = 1.0 + 0.4 * np.sin(2 * np.pi * seconds / (86400 * w["period_days"]) + w["phase"])
        anomaly += w["amplitude"] * envelope * np.sin(k * along + w["phase"])
    cloud = 1.0 / (1.0 + np.exp(-anomaly / 1.5))  # warm, moist crests are cloudy
    return anomaly, cloud


def generate_regional_t2m(path: str | Path, steps: int = 2160, seed: int = 1) -> Path:
    """Write ``steps`` hourly states (default 90 days from 1 May 2021) of the box of
    :func:`box_points` to an anemoi-datasets store at ``path``; return the path."""
    rng = np.random.default_rng(seed)
    lat, lon = box_points()
    land, height = _static_fields(lat, lon, rng)
    lon_e = (lon + 180) % 360 - 180
    x = EARTH_RADIUS_M * np.cos(np.radians(50.0)) * np.radians(lon_e)
    y = EARTH_RADIUS_M * np.radians(lat - 50.0)
    waves = _waves(rng)
    base = 287.0 - 0.6 * (lat - 50.0) - 0.0065 * height
    amplitude = np.where(land > 0, 6.0, 1.0)
    noise = np.zeros_like(lat)
    data = np.empty((steps, len(VARIABLES), 1, len(lat)), np.float32)
    dates = START + np.arange(steps) * np.timedelta64(1, "h")
    for i, date in enumerate(dates):
        seconds = float(i * 3600)
        anomaly, cloud = _weather(x, y, seconds, waves)
        utc_h = (date - date.astype("datetime64[D]")).astype(int) / 3600.0
        local_h = (utc_h + lon_e / 15.0) % 24.0
        daily = amplitude * (1.0 - 0.6 * cloud) * np.cos(2 * np.pi * (local_h - 15.0) / 24.0)
        seasonal = 6.0 * i / max(1, steps - 1)
        noise = 0.8 * noise + 0.4 * np.sqrt(1 - 0.8**2) * rng.standard_normal(len(lat))
        data[i, 0, 0] = base + seasonal + daily + anomaly + noise
        data[i, 1, 0], data[i, 2, 0] = land, height * G
    return write_anemoi_store(
        path,
        data,
        dates,
        VARIABLES,
        lat,
        lon,
        resolution="0.5",
        extra_attrs={
            "description": "SYNTHETIC hourly 2 m temperature over a regional box (gridshard): a daily cycle, "
            "travelling weather anomalies with cloud, static land-sea mask and orography, AR(1) noise",
            "units": {"2t": "K", "lsm": "1", "z": "m2 s-2"},
            "waves": waves,
        },
        recipe={"name": "regional_t2m", "generator": {"steps": steps, "seed": seed}},
    )
