"""Reading datasets in the anemoi-datasets Zarr layout (zarr 2.18 or zarr 3).

A store holds ``data`` of shape ``(time, variable, ensemble, points)``, per-point
``latitudes`` and ``longitudes``, ``dates`` (``datetime64[s]``; epoch seconds in stores written
by earlier gridshard versions), the variable names in the ``variables`` attribute (or
``name_to_index``), per-variable statistics ``mean`` and ``stdev`` used to normalise, the
``frequency`` of its dates, and ``missing_dates``: dates anemoi-datasets had no data for, written
as NaN. ``resolution`` and ``field_shape`` name its grid when present. A store built with
anemoi-datasets' ``build.allow_nans`` (a land-only product) may hold NaN elsewhere too: a point
with no value at any date is left out of the grid, and a point's gaps on some dates are read as
missing dates (:mod:`training.data.gappy_points`).

The reader presents the points in the processor's order (:func:`processor.point_sets.point_set`
read from the coordinates: rings or rows north to south, west to east; a Hilbert curve through
an unstructured set), whatever order the store holds them in, so that a rank's contiguous
block of points is a compact region and the attention window a band of neighbours. Every
per-point array it gives (``latitudes``, ``longitudes``, ``area_weights``, states) is in that
order; forecasts written from it carry their coordinates in it too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from processor.errors import UserError
from processor.point_sets import PointSet, point_set
from training.data.dates import as_datetime64, frequency_seconds, present_runs
from training.data.forcings import VariableRoles, store_given_fields
from training.data.gappy_points import partial_fields, plan_gaps, scan_points
from training.data.read_plan import ReadPlan, load_plan, plan_key, save_plan
from training.data.state_cache import STATE_CACHE_BYTES, StateCache

log = logging.getLogger(__name__)


class DatasetError(UserError):
    """The dataset is missing, malformed, or does not fit the configuration."""


class ZarrDataset:
    """Normalised states ``(points, variables)`` of any ensemble member, by time index.

    Attributes: ``variables``, ``latitudes``/``longitudes`` ``(points,)`` in degrees, ``dates``
    ``(time,)`` ``datetime64[s]``, ``frequency_s`` (seconds between dates), ``missing`` (time
    indices with no data), ``n_times``, ``n_members``, ``n_points``, ``resolution`` (or None),
    ``field_shape``, ``mean``/``stdev`` ``(variables,)``; ``point_set`` (the grid read from the
    coordinates) and ``area_weights`` ``(points,)`` (cell areas, mean 1); ``roles`` (which
    variables are forcings and diagnostics) and ``output_mean``/``output_stdev`` (of the model's
    outputs). Points are in processor order (see the module).
    """

    def __init__(
        self,
        path: str | Path,
        variables: list[str] | None = None,
        forcing: list[str] | None = None,
        diagnostic: list[str] | None = None,
        plan_dir: str | Path | None = None,
    ) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise DatasetError(f"dataset not found at {self.path} (set data.path, or data.generate=true)")
        try:
            root = zarr.open_group(str(self.path), mode="r")
            self._data = root["data"]
            attrs = dict(root.attrs)
            names = _variable_names(attrs)
            latitudes, longitudes = root["latitudes"][:], root["longitudes"][:]
            dates = root["dates"][:]
            mean, stdev = np.asarray(root["mean"][:]), np.asarray(root["stdev"][:])
        except (KeyError, FileNotFoundError, ValueError, TypeError) as exc:
            raise DatasetError(f"{self.path} is not an anemoi-style Zarr dataset: {exc!r}") from exc
        if not np.issubdtype(dates.dtype, np.datetime64):
            log.warning(
                "%s has integer dates (an earlier gridshard wrote it): anemoi-datasets cannot read it; "
                "delete it to have the built-in dataset written again in the anemoi layout",
                self.path,
            )
        dates = as_datetime64(dates)
        self._chunks = tuple(self._data.chunks)
        missing_dates = {np.datetime64(d, "s") for d in attrs.get("missing_dates", [])}
        missing = {i for i, d in enumerate(dates) if d in missing_dates}
        self._setup(names, latitudes, longitudes, dates, mean, stdev, variables, missing)
        self.constant_fields = tuple(attrs.get("constant_fields") or ())
        self.given_fields = store_given_fields(names, self.constant_fields, attrs.get("variables_metadata"))
        self.assign_roles(forcing, diagnostic)
        self.frequency_s = self._frequency(attrs.get("frequency"))
        self.resolution: str | None = attrs.get("resolution")
        self.field_shape = tuple(attrs.get("field_shape", (self.n_points,)))
        self.read_plan: ReadPlan | None = None  # set where the store allows NaN
        if attrs.get("allow_nans"):  # anemoi-datasets' build.allow_nans: a land-only product's sea
            self._read_around_nans(latitudes, longitudes, (variables, forcing, diagnostic), plan_dir, attrs)
        self.check_statistics()

    def check_statistics(self) -> None:
        """Refuse variables read whose statistics cannot normalise them (a NaN or inf mean or
        stdev), once the variables are settled: a field without a value anywhere, whose statistics
        anemoi-datasets leaves NaN, is left out before (:func:`~training.data.gappy_points.partial_fields`)."""
        finite = np.isfinite(self.mean) & np.isfinite(self.stdev)
        if not finite.all():
            unusable = [v for v, ok in zip(self.variables, finite) if not ok]
            raise DatasetError(
                f"{self.path}: the statistics (mean, stdev) of {unusable} are not finite, so they cannot normalise: "
                "leave them out (data.variables=[...]) or rebuild the store with anemoi-datasets"
            )

    def _read_around_nans(
        self, latitudes: np.ndarray, longitudes: np.ndarray, chosen: tuple, plan_dir: str | Path | None, attrs: Any
    ) -> None:
        """In a store that allows NaN (:mod:`~training.data.gappy_points`): read by the plan the
        launcher left in ``plan_dir`` (:mod:`~training.data.read_plan`), else by one made here.
        ``latitudes``/``longitudes``: every store point's; ``chosen``: the run's ``data.variables``,
        ``data.forcing`` and ``data.diagnostic``; ``attrs``: the store's attributes."""
        self.read_plan_key = plan_key(str(self.path), tuple(self._data.shape), attrs, chosen)
        plan = load_plan(self.read_plan_key, plan_dir, self.variables, self._data.shape[-1]) or self._plan_reads(chosen)
        if list(plan.variables) != self.variables:
            self._select_variables(list(plan.variables))
            self.assign_roles(*chosen[1:])
        self.missing = self.missing | plan.missing
        if len(plan.kept) < self.n_points:  # else the grid stands as set up
            self._set_points(latitudes, longitudes, plan.kept, self.point_set.areas)  # the whole grid's cells
            self.field_shape = (self.n_points,)  # no longer the store's full field
        self.read_plan = plan

    def save_read_plan(self, run_dir: str | Path) -> None:
        """Leave the plan this store is read by in ``run_dir`` for the ranks (none without NaN)."""
        if self.read_plan is not None:
            save_plan(self.read_plan, self.read_plan_key, run_dir, self._data.shape[-1])

    def _plan_reads(self, chosen: tuple) -> ReadPlan:
        """The plan from a scan of the store: leave out the fields over part of the grid when the run
        reads every variable (``data.variables`` unset), then the points and dates with no value."""
        variables, forcing, diagnostic = chosen
        scan = scan_points(self.blocks(), len(self.variables), self._data.shape[-1])
        wanted = list(self.variables)
        if variables is None:
            named = set(forcing or ()) | set(diagnostic or ())
            left_out = partial_fields(scan, self.variables, named, set(self.constant_fields), str(self.path))
            if left_out:
                kept = [i for i, name in enumerate(self.variables) if name not in left_out]
                scan, wanted = scan.select(kept), [self.variables[i] for i in kept]
                self._select_variables(wanted)  # the gap plan reads these alone
                self.assign_roles(forcing, diagnostic)
        try:
            gaps = plan_gaps(self.blocks, scan, self.n_times - len(self.missing), str(self.path))
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        return ReadPlan(tuple(wanted), gaps.kept, gaps.missing, scan.finite)

    def _setup(
        self,
        names: list[str],
        latitudes: np.ndarray,
        longitudes: np.ndarray,
        dates: np.ndarray,
        mean: np.ndarray,
        stdev: np.ndarray,
        variables: list[str] | None,
        missing: set[int],
    ) -> None:
        """Check the shapes against ``data`` and keep what the reader needs."""
        shape = tuple(self._data.shape)
        if len(shape) != 4:
            raise DatasetError(f"{self.path}: 'data' must be (time, variable, ensemble, points), got {shape}")
        n_time, n_var, n_members, n_points = shape
        if n_members < 1:
            raise DatasetError(f"{self.path}: 'data' has no ensemble member (shape {shape})")
        if len(names) != n_var or len(mean) != n_var or len(stdev) != n_var:
            raise DatasetError(f"{self.path}: {n_var} variables in 'data' but {len(names)} names / statistics")
        if len(latitudes) != n_points or len(longitudes) != n_points:
            raise DatasetError(f"{self.path}: coordinates do not have one entry per point ({n_points})")
        if len(dates) != n_time:
            raise DatasetError(f"{self.path}: {len(dates)} dates for {n_time} states in 'data'")
        self._stored_variables = (list(names), np.asarray(mean), np.asarray(stdev))
        self._select_variables(names if variables is None else list(variables))
        self.dates = dates
        self.missing = frozenset(missing)
        self.n_times, self.n_members = n_time, n_members
        self._set_points(latitudes, longitudes, np.arange(n_points))

    def _select_variables(self, wanted: list[str]) -> None:
        """Read the store's variables ``wanted``, in that order, with their statistics."""
        names, mean, stdev = self._stored_variables
        unknown = [v for v in wanted if v not in names]
        if unknown:
            raise DatasetError(f"variables {unknown} are not in {self.path}; it has {names}")
        self.variables = wanted
        self._index = [names.index(v) for v in wanted]
        self._states = StateCache(STATE_CACHE_BYTES)
        self.mean = mean[self._index].astype(np.float32)
        self.stdev = np.maximum(stdev[self._index], 1e-12).astype(np.float32)

    def _set_points(
        self, latitudes: np.ndarray, longitudes: np.ndarray, stored: np.ndarray, areas: np.ndarray | None = None
    ) -> None:
        """The grid of the store's points ``stored`` ``(kept,)`` (ascending store indices): every
        point, or those :func:`~training.data.gappy_points.plan_gaps` keeps. ``areas``: every
        store point's cell area (None: those of ``stored`` alone), so that the land of a box
        keeps its cells' areas rather than the triangles of the points left."""
        lat, lon = np.asarray(latitudes, dtype=np.float64)[stored], np.asarray(longitudes, dtype=np.float64)[stored]
        try:
            self.point_set: PointSet = point_set(lat, lon)
        except ValueError as exc:
            raise DatasetError(f"{self.path}: its latitudes/longitudes are no usable point set: {exc}") from None
        order = stored[self.point_set.order]  # processor order -> store index
        self._order = None if np.array_equal(order, np.arange(self._data.shape[-1])) else order
        self.stored_points = None if len(stored) == self._data.shape[-1] else stored  # (kept,), None: every one
        self.latitudes, self.longitudes = lat[self.point_set.order], lon[self.point_set.order]
        kept_areas = (self.point_set.areas if areas is None else areas[stored])[self.point_set.order]
        self.area_weights = kept_areas / kept_areas.mean()
        self.n_points = len(stored)

    def assign_roles(self, forcing: list[str] | None, diagnostic: list[str] | None) -> None:
        """Which variables are forcings (inputs only) and diagnostics (outputs only): ``roles``
        (:class:`~training.data.forcings.VariableRoles`); a ``DatasetError`` naming the key."""
        try:
            self.roles = VariableRoles.build(self.variables, forcing, diagnostic, self.given_fields)
        except ValueError as exc:
            raise DatasetError(f"{exc} (in {self.path})") from None
        columns = self.roles.output_columns()
        self.output_mean, self.output_stdev = self.mean[columns], self.stdev[columns]

    def denormalise_outputs(self, x: np.ndarray) -> np.ndarray:
        """``(..., outputs)`` normalised model outputs (``roles.outputs``) -> physical units."""
        return x * self.output_stdev + self.output_mean

    def _frequency(self, attribute: Any) -> int:
        """Seconds between dates: the ``frequency`` attribute, checked against ``dates``."""
        steps = np.diff(self.dates).astype("timedelta64[s]").astype(np.int64)
        try:
            frequency = frequency_seconds(attribute) if attribute is not None else int(steps[0]) if len(steps) else 0
        except ValueError as exc:
            raise DatasetError(f"{self.path}: {exc}") from None
        if frequency <= 0 or (steps != frequency).any():
            raise DatasetError(
                f"{self.path}: dates are not regularly spaced at its frequency {attribute!r} "
                f"(steps found: {sorted({int(s) for s in steps})} s)"
            )
        return frequency

    def _read(self, index: tuple) -> np.ndarray:
        """Raw values at a ``(time, variable, member, points)`` index, points in store order."""
        return np.asarray(self._data[index])

    def _read_points(self, t: int | slice, member: int, points: slice) -> np.ndarray:
        """Raw ``(all variables, points)`` of a block of points in processor order (``(times, all
        variables, points)`` for a slice of times): the span of store points that holds them, read
        at once (a date is usually one chunk), then picked."""
        if self._order is None:
            return self._read((t, slice(None), member, points))
        wanted = self._order[points]
        if not len(wanted):
            empty = (self._data.shape[1], 0)
            return np.empty(empty if isinstance(t, int) else (len(range(self.n_times)[t]), *empty), np.float32)
        lo, hi = int(wanted.min()), int(wanted.max()) + 1
        return self._read((t, slice(None), member, slice(lo, hi)))[..., wanted - lo]

    def preload(self, points: slice, members: list[int]) -> bool:
        """Read every date of ``members`` on ``points`` into memory, a block of whole chunks at a
        time, when they fit in half the state cache (a small store: then no step waits for a
        read); False, reading nothing, when they do not."""
        n_points = len(range(self.n_points)[points])
        if self.n_times * len(members) * n_points * len(self.variables) * 4 > self._states.capacity // 2:
            return False
        chunk = max(self._chunks[0], 1)  # dates a chunk holds
        for member in members:
            for times in self._present_blocks(chunk * max(1, 64 // chunk)):  # about 64 dates a read
                try:
                    raw = self._read_points(times, member, points).astype(np.float32)[:, self._index]
                except Exception as exc:  # a corrupt or missing chunk: say which dates, not deep in zarr
                    raise DatasetError(
                        f"cannot read dates {self.date(times.start)} to {self.date(times.stop - 1)} of {self.path}: "
                        f"{type(exc).__name__}: {exc} (data.preload=false reads each date as training needs it)"
                    ) from exc
                for t, state in zip(range(times.start, times.stop), self._normalise(raw)):
                    self._states.put((t, member, points.start, points.stop), state)
        return True

    def _present_blocks(self, block: int) -> list[slice]:
        """Slices of at most ``block`` consecutive dates that are not missing (anemoi-datasets
        refuses a read that spans a missing date)."""
        blocks, start = [], None
        for t in range(self.n_times + 1):
            present = t < self.n_times and t not in self.missing
            if present and start is None:
                start = t
            if start is not None and (not present or t - start == block):
                blocks.append(slice(start, t))
                start = t if present else None
        return blocks

    def state(self, t: int, points: slice = slice(None), member: int = 0) -> np.ndarray:
        """Normalised ``(points, variables)`` of ``member`` at time index ``t`` (optionally a block
        of points)."""
        if t in self.missing:
            raise DatasetError(f"date {self.date(t)} (index {t}) is a missing date of {self.path}")
        key = (t, member, points.start, points.stop)
        state = self._states.get(key)
        if state is None:
            state = self._states.put(key, self._normalised(t, points, member))
        return state

    def _normalised(self, t: int, points: slice, member: int) -> np.ndarray:
        try:
            raw = self._read_points(t, member, points).astype(np.float32)[self._index]
        except Exception as exc:  # a corrupt or missing chunk: say where, not deep in zarr
            # A chunk holds every variable of a date: name the date and the variables read.
            raise DatasetError(
                f"cannot read date {self.date(t)} (index {t}), variables {', '.join(self.variables)}, "
                f"of {self.path}: {type(exc).__name__}: {exc}"
            ) from exc
        return self._normalise(raw)

    def _normalise(self, raw: np.ndarray) -> np.ndarray:
        """Raw ``(..., variables, points)`` -> normalised ``(..., points, variables)``, a copy."""
        return ((raw - self.mean[:, None]) / self.stdev[:, None]).swapaxes(-1, -2).copy()

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        """``(..., variables)`` normalised -> physical units."""
        return x * self.stdev + self.mean

    def date(self, t: int) -> str:
        """The date at time index ``t`` as ISO text."""
        return str(self.dates[t])

    def check_finite(self, block_bytes: int = 16 * 2**20) -> None:
        """Raise ``DatasetError`` naming the variable, member, date and point of the first NaN or
        inf outside the missing dates (anemoi writes NaN there; no sample reads them).

        Points left out of the grid (:func:`~training.data.gappy_points.plan_gaps`) are not read;
        a store read by a plan whose scan saw no inf is not read again (every NaN is read around).
        """
        if self.read_plan is not None and self.read_plan.finite:
            return
        for run, p0, block, block_dates in self.blocks(block_bytes):
            finite = np.isfinite(block)
            if self.stored_points is not None:
                finite |= ~np.isin(np.arange(p0, p0 + block.shape[-1]), self.stored_points)
            if not finite.all():
                self._report(block, finite, run, p0, block_dates)

    def blocks(self, block_bytes: int = 16 * 2**20) -> Iterator[tuple[range, int, np.ndarray, range]]:
        """Every present date of the store, as blocks ``(dates, variables, members, store points
        p0..)`` of this dataset's variables: ``(dates, p0, block, the block's span of dates)``.

        Reads whole chunks, at most about ``block_bytes`` at a time (time first, then points when
        one date alone is larger), so memory stays bounded for any store.
        """
        n_var, n_members, n_stored = self._data.shape[1], self.n_members, self._data.shape[-1]
        chunk_t, chunk_p = self._chunks[0], self._chunks[3]
        row_bytes = n_var * n_members * 4  # one point of one date, every member
        points_per_block = max(chunk_p, block_bytes // row_bytes // chunk_p * chunk_p)
        points_per_block = min(points_per_block, n_stored)
        dates_per_block = max(chunk_t, block_bytes // (row_bytes * points_per_block) // chunk_t * chunk_t)
        for t0 in range(0, self.n_times, dates_per_block):
            block_dates = range(t0, min(t0 + dates_per_block, self.n_times))
            for run in present_runs(block_dates, self.missing):
                for p0 in range(0, n_stored, points_per_block):
                    block = self._read_block(run, slice(p0, p0 + points_per_block))[:, self._index]
                    yield run, p0, block, block_dates

    def _report(self, block: np.ndarray, finite: np.ndarray, run: range, p0: int, block_dates: range) -> None:
        t, v, m, p = np.argwhere(~finite)[0]  # p: a store index (the store's own order)
        member = f", member {m}" if self.n_members > 1 else ""
        raise DatasetError(
            f"non-finite value {block[t, v, m, p]} in {self.path}: variable {self.variables[v]!r}{member}, "
            f"date {self.date(run.start + t)} (index {run.start + t}), point {p0 + p} "
            f"({int((~finite).sum())} non-finite values in date indices {block_dates.start}..{block_dates.stop - 1}; "
            "a date with no data must be listed in the store's missing_dates)"
        )

    def _read_block(self, dates: range, points: slice) -> np.ndarray:
        """Raw ``(dates, all variables, members, points)``; a ``DatasetError`` naming the first
        unreadable date (a corrupt or truncated chunk) otherwise."""
        try:
            return self._read((slice(dates.start, dates.stop), slice(None), slice(None), points))
        except Exception:
            for t in dates:  # narrow it down to one date
                try:
                    self._read((t, slice(None), slice(None), points))
                except Exception as exc:
                    raise DatasetError(
                        f"cannot read date {self.date(t)} (index {t}) of {self.path}: {type(exc).__name__}: {exc}"
                    ) from exc
            raise


def _variable_names(attrs: dict[str, Any]) -> list[str]:
    """The variables in store order: the ``variables`` attribute, else ``name_to_index``."""
    if "variables" in attrs:
        return list(attrs["variables"])
    mapping = attrs["name_to_index"]
    return sorted(mapping, key=mapping.get)
