"""Forecasts from one initial date, written by the model-parallel ranks to an anemoi-datasets store.

The store has the layout :mod:`training.data.anemoi_layout` writes (so ``ZarrDataset`` and
``anemoi.datasets.open_dataset`` read it): ``data`` ``(steps, variables, 1, points)`` float32 at
``dates`` = initial date + k x lead (k = 0 is the initial state), ``latitudes``/``longitudes``,
and per-variable ``mean``, ``stdev``, ``minimum``, ``maximum``.

Statistics: ``mean`` and ``stdev`` are the *source* dataset's (the ones the model was trained to
normalise with), so the project's reader normalises a forecast exactly as it normalises the data;
``minimum`` and ``maximum`` (which ``open_dataset(...).statistics`` also reads) are the forecast's
own, reduced over the ranks when the store is closed. No tendency statistics are written.

Parallel writing without gathering the grid: ``data`` is chunked ``(1, variables, 1, c)`` with
``c`` at most the smallest shard (and at most :data:`CHUNK_POINTS_CAP`). Rank ``r`` (block
``[s_r, e_r)``) writes the chunk-aligned region ``[a_r, a_{r+1})`` of store positions, ``a_r`` the
first multiple of ``c`` at or after ``s_r`` (``a_0 = 0``, ``a_P = N``), so every chunk has exactly
one writer; each date, one all-to-all brings every rank the rows of its region from the ranks
that hold them (:class:`_Routes`).

Point order: the source store's. The states come in the processor's order (the reader's);
given the source's ``point_set.order``, each row goes to the rank whose region holds its store
position, so a forecast lines up point by point with the source data in anemoi-datasets, its
``latitudes``/``longitudes`` the source's (or its kept points': ``source_points``). With no
``order``, a rank keeps its block but its first ``a_r - s_r`` rows and receives the fewer than
``c`` rows ``[e_r, a_{r+1})`` after it: no rank holds more than its block and ``c`` rows.

The store is written at ``<path>.partial`` and renamed to ``path`` by :meth:`ForecastStore.close`:
an interrupted run never leaves something that reads as a complete forecast, and an existing
``path`` (or ``path.partial``) is refused, never overwritten. Metadata is not consolidated
(neither zarr 2.18, zarr 3 nor anemoi-datasets needs it; anemoi's ``create`` does not write it).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import platform
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import zarr

from processor.distributed.shards import ShardLayout, shard_offsets
from processor.distributed.transport import Transport, collective_device
from training.data.anemoi_layout import FORMAT_VERSION, frequency_to_string
from training.data.zarr_compat import open_group_v2, write_array

log = logging.getLogger(__name__)

CHUNK_POINTS_CAP = 2**16  # points per chunk at most: a chunk is (1, variables, 1, c) float32
RESERVED = frozenset(  # attributes the store writes itself, from create's arguments
    "version frequency start_date end_date missing_dates variables name_to_index dimensions shape chunks "
    "dtype allow_nans constant_fields uuid latest_write_timestamp".split()
)


def chunk_points(sizes: tuple[int, ...] | list[int], cap: int = CHUNK_POINTS_CAP) -> int:
    """Points per chunk ``c``: the smallest non-empty shard of ``sizes`` ``(ranks,)``, at most ``cap``."""
    nonempty = [s for s in sizes if s > 0]
    if not nonempty:
        raise ValueError(f"a forecast store needs at least one point; shard sizes are {list(sizes)}")
    return max(1, min(min(nonempty), cap))


def chunk_regions(sizes: tuple[int, ...] | list[int], chunk: int) -> list[tuple[int, int]]:
    """Each rank's write region ``[a_r, a_{r+1})`` ``(ranks,)``: ``a_r`` is the first multiple of
    ``chunk`` at or after its block start (``a_0 = 0``, ``a_P = N``). Disjoint, covering ``[0, N)``."""
    total = sum(sizes)
    bounds = [min(total, -(-start // chunk) * chunk) for start in shard_offsets(list(sizes))] + [total]
    return [(bounds[r], bounds[r + 1]) for r in range(len(sizes))]


def _partial(path: Path) -> Path:
    """Where a store is written before it is complete."""
    return path.with_name(path.name + ".partial")


def _rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def _on_rank0(group: dist.ProcessGroup | None, work: Callable[[], Any]) -> Any:
    """Run ``work`` on rank 0 of ``group``; its error is raised on every rank (a broadcast, so it is
    also a barrier: no rank goes on before rank 0 is done). Returns ``work()`` on rank 0, else None."""
    result, payload = None, [None]
    if _rank(group) == 0:
        try:
            result = work()
        except Exception as exc:  # every rank raises it, not rank 0 alone while the others wait
            payload = [exc]
    if group is not None:
        dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
    if payload[0] is not None:
        raise payload[0]
    return result


def _jsonable(value: Any) -> Any:
    """``value`` with numpy scalars, dates and paths made JSON-friendly (for the attributes)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.datetime64):
        return str(np.datetime64(value, "s"))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path | datetime.datetime | datetime.date):
        return str(value)
    return value


def _routes(order: np.ndarray, layout: ShardLayout, regions: list[tuple[int, int]]) -> tuple:
    """Where this rank's rows go, ``order[i]`` being the store position of the layout's point ``i``:
    its rows sorted by store position (``send``), how many go to each rank (``sent``) and come from
    each (``received``), and the offsets in its region of the rows received, in rank order (``place``)."""
    world, (a, b) = layout.world_size, regions[layout.rank]
    mine = order[layout.start : layout.stop]
    region_of = np.searchsorted([stop for _, stop in regions], mine, side="right")
    owner = np.searchsorted(np.cumsum(layout.sizes), np.argsort(order)[a:b], side="right")
    sent, received = np.bincount(region_of, minlength=world), np.bincount(owner, minlength=world)
    return np.argsort(mine, kind="stable"), sent.tolist(), received.tolist(), np.argsort(owner, kind="stable")


def _provenance(layout: ShardLayout, chunk: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Who wrote the store, with what, and how it was split; ``extra`` (the caller's record, e.g.
    its git commit and checkpoint) is added to it."""
    return {
        "writer": "gridshard training.data.forecast_store",
        "gridshard_version": importlib.metadata.version("gridshard"),
        "versions": {"torch": torch.__version__, "zarr": zarr.__version__, "numpy": np.__version__},
        "host": platform.node(),
        "created": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat(),
        "ranks": layout.world_size,
        "shard_sizes": list(layout.sizes),
        "chunk_points": chunk,
        "statistics": "mean/stdev: the source dataset's (normalisation); minimum/maximum: this forecast's",
        **extra,
    }


def _attributes(variables: list[str], dates: np.ndarray, frequency_s: int, points: int, chunk: int) -> dict:
    """The anemoi attributes of a store of ``dates`` ``(steps,)`` x ``variables`` x ``points``."""
    shape = [len(dates), len(variables), 1, points]
    return {
        "version": FORMAT_VERSION,
        "frequency": frequency_to_string(frequency_s),
        "start_date": str(dates[0]),
        "end_date": str(dates[-1]),
        "missing_dates": [],
        "field_shape": [points],
        "variables": list(variables),
        "name_to_index": {v: i for i, v in enumerate(variables)},
        "dimensions": ["dates", "variables", "ensembles", "values"],
        "shape": shape,
        "chunks": [1, len(variables), 1, chunk],
        "dtype": "float32",
        "allow_nans": False,
        "attribution": "gridshard",
        "uuid": str(uuid.uuid4()),
    }


def _check_arguments(
    variables: list[str],
    coords: tuple[np.ndarray, np.ndarray],
    dates: np.ndarray,
    frequency_s: int,
    stats: tuple[np.ndarray, np.ndarray],
    layout: ShardLayout,
    attributes: dict[str, Any],
    order: np.ndarray,
) -> None:
    """Raise ``ValueError`` for shapes that do not fit: the same on every rank given the same input."""
    n, v = layout.total, len(variables)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must hold each of the {n} store positions once, got {order}")
    if len(set(variables)) != v or v == 0:
        raise ValueError(f"variables must be distinct and at least one, got {variables}")
    if any(c.shape != (n,) for c in coords):
        raise ValueError(f"latitudes/longitudes must be ({n},) (the layout's points), got {[c.shape for c in coords]}")
    if any(s.shape != (v,) for s in stats):
        raise ValueError(f"mean/stdev must be ({v},) (one per variable), got {[s.shape for s in stats]}")
    steps = np.diff(dates).astype(np.int64)
    if dates.ndim != 1 or len(dates) == 0 or frequency_s <= 0 or (steps != frequency_s).any():
        raise ValueError(f"dates must be 1-D, non-empty and {frequency_s} s apart; got {dates}")
    reserved = sorted(RESERVED & set(attributes))
    if reserved:
        raise ValueError(f"attributes {reserved} are written by the forecast store itself; do not pass them")
    shape = attributes.get("field_shape")
    if shape is not None and int(np.prod(shape)) != n:
        raise ValueError(f"field_shape {shape} does not hold the {n} points")


class ForecastStore:
    """A forecast being written: ``data`` ``(steps, variables, 1, points)`` at ``<path>.partial``.

    Attributes: ``path`` (where :meth:`close` puts it), ``chunk`` (points per chunk), ``region``
    (this rank's ``[a_r, a_{r+1})``), ``layout``, ``variables``, ``dates`` ``(steps,)``.
    """

    def __init__(
        self,
        path: Path,
        data: Any,
        layout: ShardLayout,
        group: dist.ProcessGroup | None,
        variables: list[str],
        dates: np.ndarray,
        root: Any = None,
        transport: Transport | None = None,
        order: np.ndarray | None = None,
    ) -> None:
        """Use :meth:`create`. ``data`` is the open ``data`` array; ``root`` the group, on rank 0;
        ``order`` the store position of each of the layout's points (None: the layout's order)."""
        self.path, self._data, self.layout, self.group = path, data, layout, group
        self.transport = transport
        self.variables, self.dates, self._root = list(variables), dates, root
        self.chunk = int(data.chunks[3])
        regions = chunk_regions(layout.sizes, self.chunk)
        self.region, order = regions[layout.rank], np.arange(layout.total) if order is None else order
        self._send, self._sent, self._received, self._place = _routes(order, layout, regions)
        self._low = np.full(len(variables), np.inf)
        self._high = np.full(len(variables), -np.inf)
        self._written: set[int] = set()
        self.closed = False

    @property
    def writing_path(self) -> Path:
        """Where the store is until :meth:`close`: ``<path>.partial``."""
        return _partial(self.path)

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        variables: list[str],
        latitudes: np.ndarray,
        longitudes: np.ndarray,
        dates: np.ndarray,
        frequency_s: int,
        mean: np.ndarray,
        stdev: np.ndarray,
        attributes: dict[str, Any],
        layout: ShardLayout,
        group: dist.ProcessGroup | None,
        transport: Transport | None = None,
        order: np.ndarray | None = None,
    ) -> ForecastStore:
        """Create the store (collective over ``group``, None for one rank): rank 0 writes the arrays
        and metadata at ``<path>.partial`` (refusing an existing ``path`` or ``<path>.partial``) and
        the others then open it. ``latitudes``/``longitudes`` ``(points,)`` in degrees, ``dates``
        ``(steps,)`` ``datetime64[s]``, ``mean``/``stdev`` ``(variables,)`` of the source dataset.
        ``attributes`` become store attributes (``resolution``, ``field_shape``, ``initial_date``,
        ``checkpoint``, ...); a ``provenance`` mapping among them (git commit, checkpoint, ...) is
        merged into the store's own provenance record. ``transport``: what sends the rows
        in :meth:`write` (the session's; default: the process group). ``order``: the store position of
        each point of the states and coordinates (the source's ``point_set.order``); None: the layout's."""
        world = 1 if group is None else dist.get_world_size(group)
        if (layout.world_size, layout.rank) != (world, _rank(group)):
            raise ValueError(
                f"layout is rank {layout.rank} of {layout.world_size}, the group rank {_rank(group)} of {world}"
            )
        dates = np.asarray(dates).astype("datetime64[s]")
        coords = (np.asarray(latitudes, np.float64), np.asarray(longitudes, np.float64))
        stats = (np.asarray(mean, np.float64), np.asarray(stdev, np.float64))
        order = np.arange(layout.total) if order is None else np.asarray(order)
        _check_arguments(list(variables), coords, dates, int(frequency_s), stats, layout, attributes, order)
        coords = tuple(c[np.argsort(order)] for c in coords)  # in store order
        path, chunk = Path(path), chunk_points(layout.sizes)

        def make() -> Any:
            root = _create_group(path, len(variables), dates, coords, stats, chunk)
            attrs = _attributes(list(variables), dates, int(frequency_s), layout.total, chunk)
            record = _provenance(layout, chunk, dict(attributes.get("provenance", {})))
            root.attrs.update(_jsonable({**attrs, **attributes, "provenance": record}))
            return root

        root = _on_rank0(group, make)  # rank 0's error (an existing path, ...) raised on every rank
        if root is None:
            root = zarr.open_group(str(_partial(path)), mode="r+")
        mine = root if _rank(group) == 0 else None
        return cls(path, root["data"], layout, group, list(variables), dates, mine, transport, order)

    def write(self, step_index: int, local_state: np.ndarray | torch.Tensor) -> None:
        """Write this rank's ``(local points, variables)`` state (physical units) at date index
        ``step_index``; collective over the group (an all-to-all brings this rank the rows of its
        region). A tensor is exchanged on its device (CUDA for an NCCL group)."""
        if self.closed:
            raise RuntimeError(f"{self.path}: write after close")
        if not 0 <= step_index < len(self.dates):
            raise IndexError(f"step {step_index} outside the {len(self.dates)} dates of {self.path}")
        x = torch.as_tensor(local_state).detach().to(torch.float32)
        if tuple(x.shape) != (self.layout.local_size, len(self.variables)):
            raise ValueError(
                f"rank {self.layout.rank}: state is {tuple(x.shape)}, expected "
                f"({self.layout.local_size}, {len(self.variables)}) (local points, variables)"
            )
        a, b, v = *self.region, len(self.variables)
        x = x[torch.as_tensor(self._send, device=x.device)]  # by store position, so by region
        if self.group is not None:  # the rows of this rank's region, from the ranks that hold them
            sent, received = [n * v for n in self._sent], [n * v for n in self._received]
            x = (self.transport or Transport()).all_to_all(x.reshape(-1), sent, received, self.group).view(-1, v)
        rows = np.empty((b - a, v), np.float32)
        rows[self._place] = x.cpu().numpy()  # in store order
        if b > a:
            self._data[step_index, :, 0, a:b] = rows.T
            self._low = np.minimum(self._low, rows.min(axis=0))
            self._high = np.maximum(self._high, rows.max(axis=0))
        self._written.add(int(step_index))

    def close(self) -> None:
        """Finish the store (collective): reduce the forecast's minimum/maximum over the ranks (which
        also waits for every rank's writes), then rank 0 writes them, ``constant_fields`` and the
        dates never written as ``missing_dates``, and renames ``<path>.partial`` to ``path``."""
        if self.closed:
            return
        extremes = torch.tensor(np.concatenate([self._high, -self._low]), dtype=torch.float64)
        if self.group is not None:
            extremes = extremes.to(collective_device(self.group))  # CUDA under NCCL
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=self.group)
        high, low = np.split(extremes.cpu().numpy(), 2)
        _on_rank0(self.group, lambda: self._finish(-low, high))
        self.closed = True

    def _finish(self, low: np.ndarray, high: np.ndarray) -> None:
        """Rank 0: the forecast's statistics and final attributes, then the rename."""
        missing = [str(d) for i, d in enumerate(self.dates) if i not in self._written]
        if missing:
            log.warning("%s: dates %s were never written; they are listed as missing dates", self.path, missing)
        self._root["minimum"][:] = low
        self._root["maximum"][:] = high
        self._root.attrs.update(
            {
                "missing_dates": missing,
                "constant_fields": [v for v, lo, hi in zip(self.variables, low, high) if lo == hi],
                "latest_write_timestamp": datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat(),
            }
        )
        if self.path.exists():
            raise FileExistsError(
                f"{self.path} appeared while the forecast was written; it is left at {self.writing_path}"
            )
        self.writing_path.rename(self.path)

    def __enter__(self) -> ForecastStore:
        return self

    def __exit__(self, kind: type | None, *_: Any) -> None:
        if kind is None:  # after an error the partial store stays where it is, for a look
            self.close()


def _create_group(
    path: Path,
    n_variables: int,
    dates: np.ndarray,
    coords: tuple[np.ndarray, np.ndarray],
    stats: tuple[np.ndarray, np.ndarray],
    chunk: int,
) -> Any:
    """Rank 0: the group at ``<path>.partial`` with every array (``data`` ``(steps, variables, 1,
    points)`` empty, NaN-filled; ``minimum``/``maximum`` NaN until close), refusing to overwrite
    ``path`` or ``<path>.partial``."""
    tmp = _partial(path)
    for existing in (path, tmp):
        if existing.exists():
            raise FileExistsError(
                f"{existing} exists: a forecast store is never overwritten (two runs never write one directory); "
                "choose another output path or remove it"
            )
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()  # exclusive: of two runs racing for one path, the second fails here
    root = open_group_v2(tmp, mode="w")
    points = len(coords[0])
    nan = np.full(n_variables, np.nan)
    arrays = {
        "dates": (dates, ["time"]),
        "latitudes": (coords[0], ["cell"]),
        "longitudes": (coords[1], ["cell"]),
        "mean": (stats[0], ["variable"]),
        "stdev": (stats[1], ["variable"]),
        "minimum": (nan, ["variable"]),
        "maximum": (nan, ["variable"]),
    }
    for name, (values, dims) in arrays.items():
        write_array(root, name, values).attrs["_ARRAY_DIMENSIONS"] = dims
    shape = (len(dates), n_variables, 1, points)
    data = write_array(
        root, "data", shape=shape, dtype=np.float32, chunks=(1, n_variables, 1, chunk), fill_value=np.nan
    )
    data.attrs["_ARRAY_DIMENSIONS"] = ["time", "variable", "ensemble", "cell"]
    return root
