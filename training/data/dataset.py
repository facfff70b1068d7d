"""Reading datasets in the anemoi-datasets Zarr layout.

A store holds ``data`` of shape ``(time, variable, ensemble, points)``, per-point
``latitudes`` and ``longitudes``, ``dates``, the variable names in the ``variables``
attribute, and per-variable statistics ``mean`` and ``stdev`` used to normalise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class DatasetError(ValueError):
    """The dataset is missing, malformed, or does not fit the configuration."""


class ZarrDataset:
    """Normalised states ``(points, variables)`` of one ensemble member, by time index."""

    def __init__(self, path: str | Path, variables: list[str] | None = None) -> None:
        import zarr

        self.path = Path(path)
        if not self.path.exists():
            raise DatasetError(f"dataset not found at {self.path} (set data.path, or data.generate=true)")
        try:
            root = zarr.open_group(str(self.path), mode="r")
            self._data = root["data"]
            names = list(root.attrs["variables"])
            self.latitudes = np.asarray(root["latitudes"][:], dtype=np.float64)
            self.longitudes = np.asarray(root["longitudes"][:], dtype=np.float64)
            self.dates = np.asarray(root["dates"][:])
            mean, stdev = np.asarray(root["mean"][:]), np.asarray(root["stdev"][:])
        except (KeyError, FileNotFoundError, ValueError, TypeError) as exc:
            raise DatasetError(f"{self.path} is not an anemoi-style Zarr dataset: {exc!r}") from exc
        if self._data.ndim != 4:
            raise DatasetError(
                f"{self.path}: 'data' must be (time, variable, ensemble, points), got {self._data.shape}"
            )
        n_time, n_var, _, n_points = self._data.shape
        if len(names) != n_var or len(mean) != n_var or len(stdev) != n_var:
            raise DatasetError(f"{self.path}: {n_var} variables in 'data' but {len(names)} names / statistics")
        if len(self.latitudes) != n_points or len(self.longitudes) != n_points:
            raise DatasetError(f"{self.path}: coordinates do not have one entry per point ({n_points})")
        wanted = names if variables is None else list(variables)
        unknown = [v for v in wanted if v not in names]
        if unknown:
            raise DatasetError(f"variables {unknown} are not in {self.path}; it has {names}")
        self.variables = wanted
        self._index = [names.index(v) for v in wanted]
        self.mean = mean[self._index].astype(np.float32)
        self.stdev = np.maximum(stdev[self._index], 1e-12).astype(np.float32)
        self.n_times, self.n_points = n_time, n_points

    def state(self, t: int, points: slice = slice(None)) -> np.ndarray:
        """Normalised ``(points, variables)`` at time index ``t`` (optionally a block of points)."""
        raw = np.asarray(self._data[t, :, 0, points], dtype=np.float32)[self._index]
        return ((raw - self.mean[:, None]) / self.stdev[:, None]).T.copy()

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        """``(..., variables)`` normalised -> physical units."""
        return x * self.stdev + self.mean

    def check_finite(self) -> None:
        """Raise naming the variable, date and point of the first NaN or inf."""
        for t in range(self.n_times):
            block = np.asarray(self._data[t, :, 0, :])[self._index]
            bad = np.argwhere(~np.isfinite(block))
            if len(bad):
                v, p = bad[0]
                raise DatasetError(
                    f"non-finite value in {self.path}: variable {self.variables[v]!r}, date index {t}, point {p}"
                )
