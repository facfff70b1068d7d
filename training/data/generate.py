"""A dataset with real dynamics on the sphere, written in the anemoi-datasets Zarr layout.

Rossby–Haurwitz waves are exact solutions of the non-divergent barotropic vorticity
equation: the wave of zonal wavenumber R on a background solid-body rotation ``omega``
travels eastwards unchanged at angular speed ``nu = (R (3 + R) omega - 2 Omega) / ((1 + R)(2 + R))``.
We superpose a few waves of different R (each moving at its own speed) and add a tracer of
Gaussian blobs carried by the background rotation, in non-dimensional units
(radius 1, planetary rotation ``Omega = 1``). Variables: streamfunction ``psi``, relative
vorticity ``zeta``, winds ``u`` and ``v``, and ``tracer``; one ensemble member.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from processor.grids import get_grid

VARIABLES = ["psi", "zeta", "u", "v", "tracer"]
STEP_HOURS = 6
OMEGA_PLANET = 1.0
DAY = 2 * np.pi / OMEGA_PLANET  # one planetary rotation


def _fields(
    lat: np.ndarray, lon: np.ndarray, t: float, waves: list[dict], omega: float, blobs: list[dict]
) -> np.ndarray:
    """``(variables, points)`` at time ``t`` for the given waves and tracer blobs."""
    sin, cos = np.sin(lat), np.cos(lat)
    psi = -omega * sin
    zeta = 2 * omega * sin
    u = omega * cos
    v = np.zeros_like(lat)
    for w in waves:
        r, k = w["R"], w["K"]
        nu = (r * (3 + r) * omega - 2 * OMEGA_PLANET) / ((1 + r) * (2 + r))
        phase = r * (lon - nu * t) + w["phase"]
        shape = cos**r * sin
        psi = psi + k * shape * np.cos(phase)
        zeta = zeta - k * (r + 1) * (r + 2) * shape * np.cos(phase)
        # u = -d(psi)/d(lat), v = d(psi)/d(lon) / cos(lat)
        d_shape = cos ** (r + 1) - r * cos ** (r - 1) * sin**2
        u = u - k * d_shape * np.cos(phase)
        v = v - k * r * cos ** (r - 1) * sin * np.sin(phase)
    tracer = np.zeros_like(lat)
    for b in blobs:
        lon_b = b["lon"] + omega * t  # carried by the solid-body background flow
        cos_dist = np.sin(b["lat"]) * sin + np.cos(b["lat"]) * cos * np.cos(lon - lon_b)
        tracer = tracer + b["amp"] * np.exp(-(1 - np.clip(cos_dist, -1, 1)) / b["width"] ** 2)
    return np.stack([psi, zeta, u, v, tracer]).astype(np.float32)


def generate_rossby_haurwitz(path: str | Path, grid: str = "o32", steps: int = 400, seed: int = 1) -> Path:
    """Write ``steps`` 6-hourly states on ``grid`` to a Zarr store at ``path``; return the path."""
    import zarr

    rng = np.random.default_rng(seed)
    g = get_grid(grid)
    lat, lon = np.radians(g.latitudes), np.radians(g.longitudes)
    omega = 0.04 * OMEGA_PLANET
    waves = [
        {"R": int(r), "K": float(rng.uniform(0.6, 1.2) * omega / (1 + i)), "phase": float(rng.uniform(0, 2 * np.pi))}
        for i, r in enumerate(rng.choice([2, 3, 4, 5, 6], size=3, replace=False))
    ]
    blobs = [
        {
            "lat": float(rng.uniform(-1.0, 1.0)),
            "lon": float(rng.uniform(0, 2 * np.pi)),
            "amp": float(rng.uniform(0.5, 1.5)),
            "width": float(rng.uniform(0.15, 0.35)),
        }
        for _ in range(4)
    ]
    dt = DAY * STEP_HOURS / 24
    data = np.stack([_fields(lat, lon, i * dt, waves, omega, blobs) for i in range(steps)])[:, :, None, :]

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    root = zarr.open_group(str(tmp), mode="w", zarr_format=2)
    arr = root.create_array("data", shape=data.shape, chunks=(1, *data.shape[1:]), dtype="float32")
    arr[:] = data
    start = np.datetime64("2020-01-01T00:00:00", "s")
    dates = start + np.arange(steps) * np.timedelta64(STEP_HOURS, "h")
    root.create_array("dates", shape=(steps,), dtype="int64")[:] = dates.astype("datetime64[s]").astype(np.int64)
    root.create_array("latitudes", shape=lat.shape, dtype="float64")[:] = g.latitudes
    root.create_array("longitudes", shape=lon.shape, dtype="float64")[:] = g.longitudes
    flat = data[:, :, 0, :]
    for name, values in {
        "mean": flat.mean(axis=(0, 2)),
        "stdev": flat.std(axis=(0, 2)),
        "minimum": flat.min(axis=(0, 2)),
        "maximum": flat.max(axis=(0, 2)),
    }.items():
        root.create_array(name, shape=values.shape, dtype="float64")[:] = values
    root.attrs.update(
        {
            "variables": VARIABLES,
            "frequency": f"{STEP_HOURS}h",
            "start_date": str(dates[0]),
            "end_date": str(dates[-1]),
            "resolution": grid,
            "ensemble_dimension": 1,
            "description": "Rossby-Haurwitz waves and an advected tracer (gridshard synthetic dataset)",
            "waves": waves,
            "dates_unit": "seconds since 1970-01-01",
        }
    )
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)  # a half-written store is never mistaken for a dataset
    return path
