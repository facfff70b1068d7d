"""Forecast verification as WeatherBench 2 scores it, sharded like training.

- Scores are area-weighted over the grid's points, in physical units: the dataset's
  ``area_weights`` (cell areas from :func:`processor.point_sets.point_set`: Gaussian quadrature
  weights on Gaussian grids, latitude bands on lat-lon grids, Delaunay duals on point sets).
- Per forecast (a *sample*: one start date and member) and lead time: the weighted MSE and the
  uncentred anomaly correlation ``ACC = Σw f'o' / sqrt(Σw f'² Σw o'²)``, anomalies taken from
  a :func:`climatology`; then averaged over samples. ``RMSE = sqrt(mean over samples of MSE)``
  (WB2 convention: not the mean of per-sample RMSEs).
- Baselines: ``persistence`` (the initial state as forecast for every lead), ``climatology``
  (the climatological mean as forecast; its ACC is undefined, NaN), and for sub-daily data the
  two that know the daily cycle: ``hourly_climatology`` (the mean of the training dates at the
  valid time's UTC hour, :func:`hourly_climatology`) and ``anomaly_persistence`` (the initial
  anomaly from the hourly climatology, persisted: ``x0 - c(hour0) + c(valid hour)``); and when
  the training period spans a year, ``doy_climatology``, WeatherBench 2's climatology by day of
  year and hour (:mod:`training.skill.seasonal`), from which anomaly persistence then takes its
  anomalies (:meth:`training.skill.climatologies.Climatologies.forecasts`).

Sharding: each model-parallel rank holds a contiguous block of points and adds local sums; data-
parallel replicas add different samples. :meth:`SkillAccumulator.finalize` sums points over the
model-parallel group and samples over the data-parallel group; every rank gets the same table.
"""

from __future__ import annotations

import csv
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from processor.distributed.transport import collective_device

KINDS = ("model", "persistence", "climatology", "hourly_climatology", "anomaly_persistence")  # always scored
DOY_CLIMATOLOGY = "doy_climatology"  # scored when the training period spans a year
BASELINES = ("persistence", "climatology", "hourly_climatology", DOY_CLIMATOLOGY, "anomaly_persistence")
_N_SUMS = 5  # Σw(f-o)², Σw, Σw f'o', Σw f'², Σw o'²


def climatology(dataset: Any, dates: list[int], points: slice, member: int = 0) -> np.ndarray:
    """``(local points, variables)`` float64 mean state in physical units over the date indices
    ``dates`` (the store's missing dates skipped), read one date at a time."""
    total: np.ndarray | None = None
    count = 0
    for t in dates:
        if t in dataset.missing:
            continue
        state = dataset.denormalise(dataset.state(t, points, member).astype(np.float64))
        total = state if total is None else total + state
        count += 1
    if total is None:
        raise ValueError(f"no date to average: all {len(dates)} date indices given are missing or none were given")
    return total / count


def hourly_climatology(
    dataset: Any, dates_by_hour: dict[float, list[int]], points: slice, member: int = 0
) -> dict[float, np.ndarray]:
    """``{UTC hour: (local points, variables)}`` :func:`climatology` of the date indices of each
    hour of the day (the daily cycle's mean state)."""
    return {hour: climatology(dataset, dates, points, member) for hour, dates in dates_by_hour.items()}


class SkillRow(NamedTuple):
    kind: str
    variable: str
    lead_h: float
    rmse: float
    acc: float
    n_samples: int


def _fmt(x: float, spec: str = ".4g") -> str:
    return "–" if not math.isfinite(x) else format(x, spec)


@dataclass
class SkillTable:
    """Scores per (kind, variable, lead): RMSE (physical units), uncentred ACC, samples averaged;
    ``centroids``: a tracer's centroid position errors (:class:`training.skill.centroid.CentroidTable`)."""

    rows: list[SkillRow]
    centroids: Any = None

    @property
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(r.kind for r in self.rows))

    @property
    def variables(self) -> list[str]:
        return list(dict.fromkeys(r.variable for r in self.rows))

    @property
    def lead_hours(self) -> list[float]:
        return list(dict.fromkeys(r.lead_h for r in self.rows))

    def _series(self, kind: str, variable: str, field: str) -> list[float]:
        found = {r.lead_h: getattr(r, field) for r in self.rows if r.kind == kind and r.variable == variable}
        if not found:
            raise KeyError(f"no scores for kind {kind!r}, variable {variable!r}; kinds {self.kinds}")
        return [float(found[h]) for h in self.lead_hours]

    def rmse(self, kind: str, variable: str) -> list[float]:
        """RMSE of ``kind`` for ``variable``, one per lead (in :attr:`lead_hours` order)."""
        return self._series(kind, variable, "rmse")

    def acc(self, kind: str, variable: str) -> list[float]:
        """Uncentred ACC of ``kind`` for ``variable``, one per lead (NaN for climatology)."""
        return self._series(kind, variable, "acc")

    def n_samples(self, kind: str, variable: str) -> list[int]:
        return [int(n) for n in self._series(kind, variable, "n_samples")]

    def _present(self) -> list[str]:
        """Kinds with at least one sample."""
        return [k for k in self.kinds if any(r.n_samples for r in self.rows if r.kind == k)]

    def to_markdown(self) -> str:
        """One table per variable, one row per lead: RMSE of each kind, skill vs persistence
        (``1 - RMSE model / RMSE persistence``, positive: better), ACC of each kind that has one."""
        kinds = self._present()
        skill = "model" in kinds and "persistence" in kinds
        lines = [
            "Area-weighted scores in physical units, averaged over samples: RMSE = sqrt(mean MSE), "
            "ACC uncentred (anomalies from climatology), as WeatherBench 2."
        ]
        for var in self.variables:
            with_acc = [k for k in kinds if any(math.isfinite(a) for a in self.acc(k, var))]
            head = ["lead (h)", *(f"{k} RMSE" for k in kinds)]
            head += ["skill vs persistence"] * skill + [f"{k} ACC" for k in with_acc] + ["samples"]
            lines += ["", f"### {var}", "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
            for i, lead in enumerate(self.lead_hours):
                cells = [f"{lead:g}", *(_fmt(self.rmse(k, var)[i]) for k in kinds)]
                if skill:
                    cells.append(_fmt(1 - self.rmse("model", var)[i] / self.rmse("persistence", var)[i], "+.3f"))
                cells += [_fmt(self.acc(k, var)[i], ".4f") for k in with_acc]
                counts = sorted({self.n_samples(k, var)[i] for k in kinds})
                cells.append("/".join(map(str, counts)))
                lines.append("| " + " | ".join(cells) + " |")
        centroids = self.centroids.to_markdown() if self.centroids is not None else ""
        return "\n".join(lines) + "\n" + centroids

    def to_csv(self, path: str | Path) -> Path:
        """Write the rows (``kind,variable,lead_h,rmse,acc,n_samples``) to ``path``; return it."""
        path = Path(path)
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(SkillRow._fields)
            for r in self.rows:
                writer.writerow([r.kind, r.variable, f"{r.lead_h:g}", repr(r.rmse), repr(r.acc), r.n_samples])
        return path

    def metrics(self) -> dict[str, float]:
        """The table as one evaluation's MLflow metrics, the lead in each name:
        ``eval/rmse/<variable>/<kind>/<lead>`` and ``eval/acc/<variable>/<kind>/<lead>`` for every
        row (NaN left out: no samples, climatology's ACC), and
        ``eval/rmse/<variable>/model_over_persistence/<lead>`` (below 1: better than persistence).
        Logged at the training step of the model scored (see docs/your-data.md, "Evaluations in MLflow")."""
        labels = lead_labels(self.lead_hours)
        out: dict[str, float] = {}
        for r in self.rows:
            for name, value in (("rmse", r.rmse), ("acc", r.acc)):
                if math.isfinite(value):
                    out[f"eval/{name}/{metric_part(r.variable)}/{r.kind}/{labels[r.lead_h]}"] = float(value)
        if {"model", "persistence"} <= set(self.kinds):
            for var in self.variables:
                model, persistence = self.rmse("model", var), self.rmse("persistence", var)
                for lead, m, p in zip(self.lead_hours, model, persistence):
                    ratio = m / p if p > 0 else math.nan
                    if math.isfinite(ratio):
                        out[f"eval/rmse/{metric_part(var)}/model_over_persistence/{labels[lead]}"] = ratio
        return out | (self.centroids.metrics() if self.centroids is not None else {})


def lead_labels(lead_hours: list[float]) -> dict[float, str]:
    """Each lead as it appears in a metric's name: ``024h``, zero-padded so that names sort by
    lead (``006h`` before ``024h``); with two decimals when a lead is not a whole hour."""
    decimals = 0 if all(float(h).is_integer() for h in lead_hours) else 2
    width = 3 + (decimals + 1 if decimals else 0)
    return {h: f"{h:0{width}.{decimals}f}h" for h in lead_hours}


def metric_part(name: str) -> str:
    """``name`` with characters MLflow refuses in metric names replaced by ``_``."""
    return re.sub(r"[^\w\-. /]", "_", name)


class SkillAccumulator:
    """Sums of one rank's points for each (sample, kind, lead, variable); see :meth:`finalize`.

    ``weights`` ``(local points,)`` are this rank's block of the dataset's ``area_weights``;
    ``climatology`` ``(local points, variables)`` its block of :func:`climatology`.

    Contract for :meth:`finalize`: the ranks of a model-parallel group (one model replica) must
    add the same (sample_id, kind, lead_index) triples, each on its own block of points (the
    order of ``add`` calls does not matter; a mismatch raises ``ValueError`` on every rank of the
    group). Data-parallel replicas may add different samples and different numbers of them; a
    sample id must be unique across replicas (e.g. its position in the validation list).
    """

    def __init__(
        self,
        variables: list[str],
        lead_hours: list[float],
        kinds: tuple[str, ...] = KINDS,
        weights: np.ndarray | None = None,
        climatology: np.ndarray | None = None,
    ) -> None:
        if weights is None or climatology is None:
            raise TypeError("SkillAccumulator needs weights (local points,) and climatology (local points, variables)")
        self.variables, self.lead_hours, self.kinds = list(variables), [float(h) for h in lead_hours], tuple(kinds)
        self.weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        self.climatology = np.asarray(climatology, dtype=np.float64)
        expected = (len(self.weights), len(self.variables))
        if self.climatology.shape != expected:
            raise ValueError(
                f"climatology has shape {self.climatology.shape}, expected (local points, variables) = {expected}"
            )
        self._sums: dict[tuple[int, int, int], np.ndarray] = {}  # -> (5, variables)

    def add(self, kind: str, lead_index: int, forecast: np.ndarray, truth: np.ndarray, sample_id: int) -> None:
        """Add one forecast of ``kind`` at lead ``lead_index``: ``forecast``, ``truth`` are
        ``(local points, variables)`` in physical units."""
        if kind not in self.kinds:
            raise ValueError(f"unknown kind {kind!r}: this accumulator scores {self.kinds}")
        if not 0 <= lead_index < len(self.lead_hours):
            raise ValueError(f"lead_index {lead_index} is not one of the {len(self.lead_hours)} leads")
        f, o = np.asarray(forecast, dtype=np.float64), np.asarray(truth, dtype=np.float64)
        if f.shape != self.climatology.shape or o.shape != self.climatology.shape:
            raise ValueError(
                f"forecast {f.shape} and truth {o.shape} must be (local points, variables) = {self.climatology.shape}"
            )
        key = (int(sample_id), self.kinds.index(kind), int(lead_index))
        if key in self._sums:
            raise ValueError(f"sample {sample_id}, kind {kind!r}, lead index {lead_index} was already added")
        w = self.weights[:, None]
        fa, oa = f - self.climatology, o - self.climatology
        self._sums[key] = np.stack(
            [
                (w * (f - o) ** 2).sum(0),
                np.full(len(self.variables), self.weights.sum()),
                (w * fa * oa).sum(0),
                (w * fa**2).sum(0),
                (w * oa**2).sum(0),
            ]
        )

    def finalize(
        self, mp_group: dist.ProcessGroup | None = None, dp_group: dist.ProcessGroup | None = None
    ) -> SkillTable:
        """The scores of every sample added on every rank: a collective over ``mp_group`` (the
        points; None: one rank per model) then ``dp_group`` (the samples; None: one replica).
        Every rank returns the same :class:`SkillTable`."""
        keys = sorted(self._sums)
        check_same_keys(keys, mp_group)
        n_var = len(self.variables)
        sums = np.stack([self._sums[k] for k in keys]) if keys else np.zeros((0, _N_SUMS, n_var))
        if mp_group is not None and keys:
            sums = sum_over(sums, mp_group)
        totals = self._over_samples(keys, sums)
        if dp_group is not None:
            totals = sum_over(totals, dp_group)
        return self._table(totals)

    def _over_samples(self, keys: list[tuple[int, int, int]], sums: np.ndarray) -> np.ndarray:
        """``(kinds, leads, 3, variables)``: sums over samples of MSE and ACC, and sample counts,
        from the per-sample sums ``(samples, 5, variables)`` over all points."""
        out = np.zeros((len(self.kinds), len(self.lead_hours), 3, len(self.variables)))
        with np.errstate(divide="ignore", invalid="ignore"):
            for (_, kind, lead), s in zip(keys, sums):
                sq_err, weight, cross, f_sq, o_sq = s
                out[kind, lead, 0] += sq_err / weight
                out[kind, lead, 1] += cross / np.sqrt(f_sq * o_sq)
                out[kind, lead, 2] += 1
        return out

    def _table(self, totals: np.ndarray) -> SkillTable:
        rows = []
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, kind in enumerate(self.kinds):
                for v, var in enumerate(self.variables):
                    for i, lead in enumerate(self.lead_hours):
                        mse_sum, acc_sum, n = totals[k, i, :, v]
                        mean_mse = mse_sum / n if n else math.nan
                        rmse = math.sqrt(mean_mse) if mean_mse >= 0 else math.nan
                        rows.append(SkillRow(kind, var, lead, rmse, float(acc_sum / n) if n else math.nan, int(n)))
        return SkillTable(rows)


def sum_over(values: np.ndarray, group: dist.ProcessGroup) -> np.ndarray:
    """``values`` summed over the ranks of ``group`` (on the group's device: CUDA under NCCL)."""
    t = torch.from_numpy(values.copy()).to(collective_device(group))
    dist.all_reduce(t, group=group)
    return t.cpu().numpy()


def check_same_keys(keys: list[tuple[int, int, int]], group: dist.ProcessGroup | None) -> None:
    """Raise ``ValueError`` on every rank of ``group`` unless all added the same samples."""
    if group is None:
        return
    fingerprint = float(zlib.crc32(repr(keys).encode()))
    t = torch.tensor(
        [len(keys), fingerprint, -len(keys), -fingerprint], dtype=torch.float64, device=collective_device(group)
    )
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    if t[0] != -t[2] or t[1] != -t[3]:
        raise ValueError(
            "the ranks of a model-parallel group added different (sample, kind, lead) triples "
            f"(this rank: {len(keys)}; most on a rank: {int(t[0])}): every rank of a model replica "
            "must add the same samples, each on its own points"
        )
