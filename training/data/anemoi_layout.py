"""Writing a Zarr store in the layout anemoi-datasets 0.5.47 writes (format version 0.22).

What anemoi-datasets' ``create`` writes for a gridded dataset, and what its ``open_dataset`` and
``inspect`` read:

- arrays: ``data`` ``(time, variable, ensemble, cell)`` float32 chunked by date, NaN fill;
  ``dates`` ``datetime64[s]``; float64 ``latitudes``, ``longitudes``; float64 per-variable
  ``mean``, ``stdev``, ``minimum``, ``maximum`` over the statistics period (missing dates left
  out); ``statistics_tendencies_<delta>_{mean,stdev,minimum,maximum}`` of ``x(t) - x(t - delta)``
  for deltas that are multiples of the frequency;
- attributes: ``version``, ``frequency`` ("6h"), ``start_date``/``end_date``,
  ``missing_dates`` (NaN is written there), ``resolution``, ``field_shape``,
  ``constant_fields``, ``variables``, ``variables_metadata``, ``dimensions``,
  ``statistics_start_date``/``statistics_end_date``, ``recipe``, ``shape``, ``chunks``, ...
"""

from __future__ import annotations

import datetime
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from training.data.zarr_compat import open_group_v2, write_array

FORMAT_VERSION = "0.22"  # what anemoi-datasets 0.5.47 writes


def frequency_to_string(seconds: int) -> str:
    """anemoi's spelling of a frequency: ``"6h"``, ``"1d"``, ``"30m"``, ``"10s"``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _statistics(values: np.ndarray) -> dict[str, np.ndarray]:
    """Per-variable statistics of ``(samples, variable, members, points)`` over its values (a NaN,
    a point without a value, left out, as anemoi-datasets does with ``allow_nans``), as float64."""
    flat = np.moveaxis(values, 1, 0).reshape(values.shape[1], -1).astype(np.float64)
    return {
        "mean": np.nanmean(flat, axis=1),
        "stdev": np.nanstd(flat, axis=1),
        "minimum": np.nanmin(flat, axis=1),
        "maximum": np.nanmax(flat, axis=1),
    }


def compute_statistics(
    data: np.ndarray, present: np.ndarray, deltas: tuple[int, ...], frequency_s: int
) -> dict[str, np.ndarray]:
    """anemoi's statistics of ``data`` ``(time, variable, members, points)`` over the dates where
    ``present`` ``(time,)`` holds, and tendency statistics for each delta (in steps)."""
    result = _statistics(data[present])
    for delta in deltas:
        if delta >= len(data):
            continue
        pairs = present[delta:] & present[:-delta]
        if not pairs.any():
            continue
        tendencies = _statistics(data[delta:][pairs] - data[:-delta][pairs])
        name = frequency_to_string(delta * frequency_s)
        result.update({f"statistics_tendencies_{name}_{k}": v for k, v in tendencies.items()})
    return result


def constant_fields(data: np.ndarray, present: np.ndarray, variables: list[str]) -> list[str]:
    """Variables whose values do not change over the present dates of ``data``."""
    values = data[present]  # (dates, variable, members, points)
    return [v for i, v in enumerate(variables) if (values[:, i] == values[:1, i]).all()]


def _iso(date: np.datetime64) -> str:
    return str(np.datetime64(date, "s"))


def _attributes(
    data: np.ndarray,
    dates: np.ndarray,
    variables: list[str],
    resolution: str | float | None,
    present: np.ndarray,
    frequency_s: int,
) -> dict[str, Any]:
    """The store's attributes; ``present`` ``(time,)`` is False at the missing dates."""
    field_shape = [int(data.shape[-1])]
    grid = str(resolution).upper() if resolution else None
    return {
        "version": FORMAT_VERSION,
        "frequency": frequency_to_string(frequency_s),
        "start_date": _iso(dates[0]),
        "end_date": _iso(dates[-1]),
        "missing_dates": [_iso(d) for d in dates[~present]],
        "resolution": grid,
        "field_shape": field_shape,
        "constant_fields": constant_fields(data, present, variables),
        "variables": list(variables),
        "variables_metadata": {v: {"mars": {"param": v, "levtype": "sfc"}} for v in variables},
        "dimensions": ["dates", "variables", "ensembles", "values"],
        "statistics_start_date": _iso(dates[present][0]),
        "statistics_end_date": _iso(dates[present][-1]),
        "shape": list(data.shape),
        "chunks": [1, *data.shape[1:]],
        "dtype": "float32",
        "allow_nans": False,
        "licence": "CC-BY-4.0",
        "attribution": "gridshard",
        "data_request": {"grid": grid, "param_level": {"sfc": list(variables)}, "param_step": {}},
        "uuid": str(uuid.uuid4()),
        "latest_write_timestamp": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat(),
    }


def write_anemoi_store(
    path: str | Path,
    data: np.ndarray,
    dates: np.ndarray,
    variables: list[str],
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    resolution: str | float | None,
    missing: tuple[int, ...] = (),
    extra_attrs: dict[str, Any] | None = None,
    recipe: dict[str, Any] | None = None,
    tendencies: tuple[int, ...] = (1, 2, 4),
) -> Path:
    """Write ``data`` ``(time, variable, member, points)`` at regularly spaced ``dates`` ``(time,)``
    to an anemoi-datasets store at ``path`` (via ``path.partial``, renamed when complete).

    The dates in ``missing`` (indices) are written as NaN and listed in ``missing_dates``;
    statistics leave them out. Tendency statistics are written for ``tendencies`` x frequency.
    ``resolution``: the grid's name (``o96``, ``n320``, ``0.25``; or 0.25, as a store's attribute
    may read), None for a point set.
    """
    dates = np.asarray(dates).astype("datetime64[s]")
    steps = np.diff(dates).astype(np.int64)
    if len(dates) < 2 or (steps != steps[0]).any() or steps[0] <= 0:
        raise ValueError("dates must be at least two, increasing and regularly spaced")
    frequency_s = int(steps[0])
    missing = sorted({int(i) for i in missing})
    data = np.array(data, dtype=np.float32)
    data[missing] = np.nan
    present = np.ones(len(dates), dtype=bool)
    present[missing] = False

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    root = open_group_v2(tmp, mode="w")
    arrays = {
        "data": (data, (1, *data.shape[1:]), ["time", "variable", "ensemble", "cell"]),
        "dates": (dates, None, ["time"]),
        "latitudes": (np.asarray(latitudes, np.float64), None, ["cell"]),
        "longitudes": (np.asarray(longitudes, np.float64), None, ["cell"]),
    }
    for name, values in compute_statistics(data, present, tendencies, frequency_s).items():
        arrays[name] = (values, None, ["variable"])
    for name, (values, chunks, dims) in arrays.items():
        fill = np.nan if name == "data" else None
        write_array(root, name, values, chunks=chunks, fill_value=fill).attrs["_ARRAY_DIMENSIONS"] = dims
    attrs = _attributes(data, dates, list(variables), resolution, present, frequency_s)
    attrs["recipe"] = {"description": (extra_attrs or {}).get("description", ""), **(recipe or {})}
    root.attrs.update({**attrs, **(extra_attrs or {})})
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)  # a half-written store is never mistaken for a dataset
    return path
