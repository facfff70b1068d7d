"""One place for the difference between zarr 2.18 (what anemoi-datasets pins) and zarr 3.

Stores are always written in the Zarr v2 format anemoi-datasets reads: under zarr 3 that is
``zarr_format=2``; zarr 2.18 has no such argument (and no ``create_array``), and writes v2 anyway.
Reading needs no helper: ``zarr.open_group(path, mode="r")`` works under both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr

ZARR_MAJOR = int(zarr.__version__.split(".")[0])


def open_group_v2(path: str | Path, mode: str = "w") -> Any:
    """A Zarr group at ``path`` in the v2 format, for writing (``mode`` ``"w"`` or ``"a"``)."""
    if ZARR_MAJOR >= 3:
        return zarr.open_group(str(path), mode=mode, zarr_format=2)
    return zarr.open_group(str(path), mode=mode)


def write_array(
    group: Any,
    name: str,
    data: np.ndarray | None = None,
    *,
    shape: tuple[int, ...] | None = None,
    dtype: Any = None,
    chunks: tuple[int, ...] | None = None,
    fill_value: Any = None,
) -> Any:
    """Create array ``name`` in ``group`` (holding ``data`` if given, else empty of ``shape``/``dtype``)
    under either zarr; returns the array. ``chunks`` defaults to one chunk."""
    if data is not None:
        data = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        shape, dtype = data.shape, data.dtype
    assert shape is not None and dtype is not None, "give data, or shape and dtype"
    chunks = tuple(chunks) if chunks is not None else tuple(max(1, s) for s in shape)
    if ZARR_MAJOR >= 3:
        array = group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, fill_value=fill_value)
    else:
        array = group.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, fill_value=fill_value)
    if data is not None and data.size:
        array[...] = data
    return array
