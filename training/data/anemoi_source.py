"""``data.open_dataset``: train on anything ``anemoi.datasets.open_dataset`` opens (optional).

The mapping is passed as is, so every option of anemoi-datasets works: one store with
``start``/``end``/``frequency``/``select``, or combinations (``join``, ``concat``, ...)::

    data.open_dataset: {dataset: /data/era5-o96.zarr, start: 2020, end: 2021, frequency: 12h, select: [2t, msl]}

The result reads like a :class:`~training.data.dataset.ZarrDataset`: the same normalisation (by
the combined dataset's ``statistics``), missing dates (anemoi's ``missing``), frequency and
members; where one of its stores was built with ``allow_nans``, its points and fields without a
value are read around as in a store (:mod:`training.data.gappy_points`). Needs the
``anemoi-datasets`` package (and so zarr 2.18).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from training.data.dataset import DatasetError, ZarrDataset
from training.data.dates import as_datetime64
from training.data.forcings import store_given_fields


class AnemoiDataset(ZarrDataset):
    """A :class:`ZarrDataset` over ``anemoi.datasets.open_dataset(spec)``; ``variables`` picks
    among its variables (after any ``select`` in ``spec``)."""

    def __init__(
        self,
        spec: dict[str, Any],
        variables: list[str] | None = None,
        forcing: list[str] | None = None,
        diagnostic: list[str] | None = None,
        plan_dir: str | Path | None = None,
    ) -> None:
        try:
            from anemoi.datasets import open_dataset  # deferred: optional anemoi-datasets
        except ImportError as exc:
            raise DatasetError(
                f"data.open_dataset needs the anemoi-datasets package ({exc}); install it, or use data.path"
            ) from None
        if not isinstance(spec, dict):
            raise DatasetError(
                f"data.open_dataset = {spec!r}: give a mapping of anemoi.datasets.open_dataset's arguments, "
                "e.g. {dataset: /path/store.zarr, start: 2020, select: [2t]}"
            )
        self.path = f"open_dataset({spec})"  # for messages: what was opened
        try:
            ds = open_dataset(dict(spec))
            names = list(ds.variables)
            statistics = ds.statistics
            latitudes, longitudes = ds.latitudes, ds.longitudes
            dates, missing = as_datetime64(ds.dates), {int(i) for i in ds.missing}
            frequency = ds.frequency
        except Exception as exc:  # anemoi raises many kinds; say which key, and what it said
            raise DatasetError(f"data.open_dataset = {spec}: {type(exc).__name__}: {exc}") from exc
        self._data = ds
        self._chunks = tuple(getattr(ds, "chunks", None) or (1, *ds.shape[1:]))
        self._setup(names, latitudes, longitudes, dates, statistics["mean"], statistics["stdev"], variables, missing)
        self.constant_fields = tuple(getattr(ds, "constant_fields", None) or ())
        self.given_fields = store_given_fields(names, self.constant_fields, getattr(ds, "variables_metadata", None))
        self.assign_roles(forcing, diagnostic)
        self.frequency_s = self._frequency(frequency)
        self.resolution = _resolution(ds)
        self.field_shape = tuple(getattr(ds, "field_shape", (self.n_points,)))
        self.read_plan = None  # set where a store under it allows NaN
        metadata = _metadata(ds)
        if _allows_nans(metadata):
            self._read_around_nans(latitudes, longitudes, (variables, forcing, diagnostic), plan_dir, metadata)
        self.check_statistics()

    def _read(self, index: tuple) -> np.ndarray:
        """Raw values at a ``(time, variable, member, points)`` index of the anemoi dataset."""
        return np.asarray(self._data[index])


def _metadata(ds: Any) -> Any:
    """``ds.metadata()``, None where anemoi cannot describe the combination."""
    try:
        return ds.metadata()
    except Exception:  # anemoi raises many kinds
        return None


def _allows_nans(metadata: Any) -> bool:
    """Whether a store under an anemoi dataset of ``metadata`` (:func:`_metadata`) was built with
    ``allow_nans``: its ``attrs``, however deep a combination nests them (False where there is
    none; and where anemoi cannot describe the combination: its NaN, if any, are refused as before)."""
    return metadata is not None and _attrs_allow_nans(metadata)


def _attrs_allow_nans(metadata: Any) -> bool:
    """Whether any ``attrs`` in the nested ``metadata`` says ``allow_nans``."""
    if isinstance(metadata, dict):
        attrs = metadata.get("attrs")
        if isinstance(attrs, dict) and attrs.get("allow_nans"):
            return True
        return any(_attrs_allow_nans(value) for key, value in metadata.items() if key != "attrs")
    if isinstance(metadata, list):
        return any(_attrs_allow_nans(value) for value in metadata)
    return False


def _resolution(ds: Any) -> str | None:
    """The ``resolution`` of an anemoi dataset, None where a combination has none."""
    try:
        value = ds.resolution
    except Exception:
        return None
    return str(value) if value is not None else None
