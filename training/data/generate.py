"""A dataset with real dynamics on the sphere, written in the anemoi-datasets Zarr layout.

Rossby–Haurwitz waves are exact solutions of the non-divergent barotropic vorticity
equation: the wave of zonal wavenumber R on a background solid-body rotation ``omega``
travels eastwards unchanged at angular speed ``nu = (R (3 + R) omega - 2 Omega) / ((1 + R)(2 + R))``.
We superpose a few waves of different R (each moving at its own speed) and add a tracer of
Gaussian blobs carried by the background rotation, in non-dimensional units
(radius 1, planetary rotation ``Omega = 1``). Variables: streamfunction ``psi``, relative
vorticity ``zeta``, winds ``u`` and ``v``, and ``tracer``. Ensemble members (``members > 1``)
shift each wave's phase a little. The store is written exactly as anemoi-datasets lays one out
(:mod:`training.data.anemoi_layout`): ``anemoi.datasets.open_dataset`` and ``anemoi-datasets
inspect`` read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from processor.grids import get_grid
from training.data.anemoi_layout import write_anemoi_store
from training.data.dataset import DatasetError
from training.data.regional_t2m import generate_regional_t2m

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


BUILT_IN_PREFIX = "rossby_haurwitz"  # the built-in dataset is written only at a path named so
REGIONAL_PREFIX = "regional_t2m"  # the synthetic regional store (training/data/regional_t2m.py)


def check_built_in_path(path: str | Path) -> None:
    """Refuse to write a built-in dataset at a ``data.path`` not named for it: a path that does
    not exist is far more often a typo of the user's store than a request for synthetic data."""
    name = Path(path).name
    if not (name.startswith((BUILT_IN_PREFIX, REGIONAL_PREFIX)) and name.endswith(".zarr")):
        raise DatasetError(
            f"data.path = {path} does not exist: give an existing anemoi-datasets store (the built-in "
            f"datasets are written only at a path named {BUILT_IN_PREFIX}*.zarr or {REGIONAL_PREFIX}*.zarr, "
            f"as the default data/{BUILT_IN_PREFIX}_o32.zarr)"
        )


def generate_built_in(path: str | Path, grid: str | None, steps: int, seed: int) -> Path:
    """Write the built-in dataset that ``path`` is named for (see :func:`check_built_in_path`):
    the Rossby-Haurwitz waves on ``grid``, or the regional hourly 2 m temperature."""
    if Path(path).name.startswith(REGIONAL_PREFIX):
        return generate_regional_t2m(path, steps, seed)
    return generate_rossby_haurwitz(path, grid or "o32", steps, seed)


def generate_rossby_haurwitz(
    path: str | Path,
    grid: str | None = "o32",
    steps: int = 400,
    seed: int = 1,
    members: int = 1,
    missing: tuple[int, ...] = (),
) -> Path:
    """Write ``steps`` 6-hourly states on ``grid`` (``None``: o32) to an anemoi-datasets Zarr store
    at ``path``; return the path.

    ``data`` is ``(steps, 5 variables, members, points)``. The date indices in ``missing`` are
    written as NaN and listed in ``missing_dates``, as anemoi-datasets does for a date its
    sources lack.
    """
    grid = grid or "o32"
    g = get_grid(grid)
    return write_rossby_haurwitz(path, g.latitudes, g.longitudes, steps, seed, members, missing, resolution=grid)


def write_rossby_haurwitz(
    path: str | Path,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    steps: int = 400,
    seed: int = 1,
    members: int = 1,
    missing: tuple[int, ...] = (),
    resolution: str | None = None,
) -> Path:
    """:func:`generate_rossby_haurwitz` on any points (degrees ``(points,)``, any order: a lat-lon
    grid, a regional box, a point set), ``resolution`` the store's attribute (None: none)."""
    rng = np.random.default_rng(seed)
    lat, lon = np.radians(np.asarray(latitudes, np.float64)), np.radians(np.asarray(longitudes, np.float64))
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
    shifted = [[{**w, "phase": w["phase"] + 0.3 * m * (i + 1)} for i, w in enumerate(waves)] for m in range(members)]
    data = np.stack(  # (time, variable, member, points)
        [np.stack([_fields(lat, lon, i * dt, w, omega, blobs) for w in shifted], axis=1) for i in range(steps)]
    )
    start = np.datetime64("2020-01-01T00:00:00", "s")
    dates = start + np.arange(steps) * np.timedelta64(STEP_HOURS, "h")
    name = resolution or f"{len(lat)}_points"
    return write_anemoi_store(
        path,
        data,
        dates,
        VARIABLES,
        latitudes,
        longitudes,
        resolution=resolution,
        missing=missing,
        extra_attrs={
            "description": "Rossby-Haurwitz waves and an advected tracer (gridshard synthetic dataset)",
            "waves": waves,
        },
        recipe={
            "name": f"rossby_haurwitz_{name}",
            "generator": {"grid": name, "steps": steps, "seed": seed, "members": members},
        },
    )
