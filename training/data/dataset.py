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
        n_time, n_var, n_members, n_points = self._data.shape
        if n_members < 1:
            raise DatasetError(f"{self.path}: 'data' has no ensemble member (shape {self._data.shape})")
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
        try:
            raw = np.asarray(self._data[t, :, 0, points], dtype=np.float32)[self._index]
        except Exception as exc:  # a corrupt or missing chunk: say where, not deep in zarr
            raise DatasetError(f"cannot read date index {t} of {self.path}: {type(exc).__name__}: {exc}") from exc
        return ((raw - self.mean[:, None]) / self.stdev[:, None]).T.copy()

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        """``(..., variables)`` normalised -> physical units."""
        return x * self.stdev + self.mean

    def date(self, t: int) -> str:
        """The date at time index ``t`` as ISO text (stores keep datetime64 or epoch seconds)."""
        d = self.dates[t]
        return str(d if np.issubdtype(self.dates.dtype, np.datetime64) else np.datetime64(int(d), "s"))

    def check_finite(self, block_bytes: int = 16 * 2**20) -> None:
        """Raise ``DatasetError`` naming the variable, date and point of the first NaN or inf.

        Reads the store in blocks of whole chunks of at most about ``block_bytes`` (time first,
        then points when one date alone is larger), so memory stays bounded for any store.
        """
        n_time, n_var, _, n_points = self._data.shape
        chunk_t, _, _, chunk_p = self._data.chunks
        row_bytes = n_var * self._data.dtype.itemsize  # one point of one date
        points_per_block = max(chunk_p, block_bytes // row_bytes // chunk_p * chunk_p)
        points_per_block = min(points_per_block, n_points)
        dates_per_block = max(chunk_t, block_bytes // (row_bytes * points_per_block) // chunk_t * chunk_t)
        for t0 in range(0, n_time, dates_per_block):
            dates = range(t0, min(t0 + dates_per_block, n_time))
            for p0 in range(0, n_points, points_per_block):
                points = slice(p0, p0 + points_per_block)
                block = self._read_block(dates, points)[:, self._index]  # (dates, variables, points)
                finite = np.isfinite(block)
                if not finite.all():
                    t, v, p = np.argwhere(~finite)[0]
                    raise DatasetError(
                        f"non-finite value {block[t, v, p]} in {self.path}: variable {self.variables[v]!r}, "
                        f"date {self.date(t0 + t)} (index {t0 + t}), point {p0 + p} "
                        f"({int((~finite).sum())} non-finite values in date indices {dates.start}..{dates.stop - 1})"
                    )

    def _read_block(self, dates: range, points: slice) -> np.ndarray:
        """Raw ``(dates, all variables, points)`` of ensemble member 0; a ``DatasetError`` naming the
        first unreadable date (a corrupt or truncated chunk) otherwise."""
        try:
            return np.asarray(self._data[dates.start : dates.stop, :, 0, points])
        except Exception:
            for t in dates:  # narrow it down to one date
                try:
                    self._data[t, :, 0, points]
                except Exception as exc:
                    raise DatasetError(
                        f"cannot read date {self.date(t)} (index {t}) of {self.path}: {type(exc).__name__}: {exc}"
                    ) from exc
            raise
