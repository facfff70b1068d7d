"""Skill by lead time of a forecaster, sharded like training: the area-weighted RMSE and the
anomaly correlation per output variable and lead, beside persistence, climatology, the hourly
climatology, anomaly persistence and, when the training period spans a year, the climatology by
day of year and hour (:mod:`training.skill.scores`, :mod:`training.skill.seasonal`).

Initial dates are spread evenly over the validation period; data-parallel replicas take
turns with them, and every rank scores its own block of points (see
:class:`training.skill.scores.SkillAccumulator`). Used at the end of a training run and by
``python -m training.evaluate``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from processor.geometry import unit_vectors
from training.data import DatasetError
from training.data.forcings import utc_hours
from training.data.open_store import dataset_samples
from training.data.samples import Sample, evenly_spread
from training.model.rollout import rollout
from training.session import Session
from training.skill.centroid import CentroidAccumulator
from training.skill.scores import (
    BASELINES,
    DOY_CLIMATOLOGY,
    SkillAccumulator,
    SkillTable,
    climatology,
    hourly_climatology,
)
from training.skill.seasonal import SeasonalKey, doy_climatology, seasonal_keys, spans_a_year, window_dates

log = logging.getLogger(__name__)

CLIMATOLOGY_DATES = 365  # training dates averaged into the climatology, at most (evenly spread)


def evaluation_samples(session: Session, steps: int, count: int) -> list[Sample]:
    """Up to ``count`` validation samples with targets ``steps`` leads on, evenly spread."""
    try:
        val = dataset_samples(session.cfg.data, session.dataset, steps, session.cfg.model.multistep_input - 1).val
    except DatasetError as exc:
        raise DatasetError(f"evaluate.steps = {steps}: {exc}") from None
    return evenly_spread(val, count)


def climatology_dates(session: Session) -> list[int]:
    """Start dates of the training period (at most :data:`CLIMATOLOGY_DATES`, evenly spread)."""
    dates = sorted({t for t, _ in session.samples.train})
    return evenly_spread(dates, CLIMATOLOGY_DATES)


def hourly_climatology_dates(session: Session) -> dict[float, list[int]]:
    """The training period's start dates by UTC hour of the day (at most :data:`CLIMATOLOGY_DATES`
    per hour, evenly spread): what :func:`training.skill.scores.hourly_climatology` averages."""
    dates = sorted({t for t, _ in session.samples.train})
    hours = utc_hours(session.dataset.dates[dates])
    by_hour: dict[float, list[int]] = {}
    for t, hour in zip(dates, hours):
        by_hour.setdefault(float(hour), []).append(t)
    return {hour: evenly_spread(ts, CLIMATOLOGY_DATES) for hour, ts in sorted(by_hour.items())}


def doy_climatology_dates(session: Session, targets: Iterable[SeasonalKey]) -> list[int] | None:
    """The training period's start dates in the windows of the ``(day of year, hour)`` targets
    (at most :data:`CLIMATOLOGY_DATES` per hour, evenly spread): what
    :func:`training.skill.seasonal.doy_climatology` averages; None when the training period
    (its samples' dates and targets) spans less than a year.

    Why a year: the window of a day of year (61 days) must find training dates around it in
    every season scored, and the validation period follows the training period. Shorter, the
    days of year past its end have none, or only the training period's last days; and on a store
    shorter than the window (a month) every window holds every training date of its hour: the
    hourly climatology of fewer dates, nothing to learn from it."""
    dataset = session.dataset
    dates = sorted({t for t, _ in session.samples.train})
    last = dataset.dates[dates[-1]] + np.timedelta64(session.samples.lead * dataset.frequency_s, "s")
    if not spans_a_year(dataset.dates[dates[0]], last, dataset.frequency_s):
        return None
    by_hour = window_dates(dataset.dates, dates, targets)
    return sorted(t for ts in by_hour.values() for t in evenly_spread(ts, CLIMATOLOGY_DATES))


@dataclass
class Climatologies:
    """The baselines' climatologies of the training period on this rank's points, the model's
    outputs, in physical units: ``plain`` ``(local points, outputs)``, ``hourly`` ``{UTC hour:
    (local points, outputs)}``, ``seasonal`` ``{(day of year, hour): (local points, outputs)}``
    (None: the training period spans less than a year); ``dates``: the dataset's."""

    plain: np.ndarray
    hourly: dict[float, np.ndarray]
    seasonal: dict[SeasonalKey, np.ndarray] | None
    dates: np.ndarray

    @property
    def kinds(self) -> tuple[str, ...]:
        """The baselines scored, in the order of :data:`training.skill.scores.BASELINES`."""
        return tuple(k for k in BASELINES if k != DOY_CLIMATOLOGY or self.seasonal is not None)

    def forecasts(self, initial: np.ndarray, t: int, valid: int) -> dict[str, np.ndarray]:
        """Each baseline's forecast ``(local points, outputs)`` from date index ``t``, whose state
        is ``initial``, for date index ``valid``."""
        return _baselines(initial, self.plain, self.hourly, self.dates, t, valid, self.seasonal)


def training_climatologies(session: Session, dates: Iterable[int]) -> Climatologies:
    """The :class:`Climatologies` of ``session``'s training period on its points; the one by day
    of year for the ``(day of year, hour)`` of the date indices ``dates`` (the initial and valid
    dates to be scored; others are not computed)."""
    dataset, points = session.dataset, session.points
    columns = dataset.roles.output_columns()
    plain = climatology(dataset, climatology_dates(session), points)[:, columns]
    by_hour = hourly_climatology(dataset, hourly_climatology_dates(session), points)
    targets = set(seasonal_keys(dataset.dates[sorted(set(dates))]))
    seasonal_dates = doy_climatology_dates(session, targets)
    seasonal = None
    if seasonal_dates is not None:
        seasonal = doy_climatology(dataset, seasonal_dates, targets, points, columns=columns)
    return Climatologies(plain, {h: c[:, columns] for h, c in by_hour.items()}, seasonal, dataset.dates)


def lead_hours(session: Session, steps: int) -> list[float]:
    step_h = session.samples.lead * session.dataset.frequency_s / 3600
    return [step_h * (k + 1) for k in range(steps)]


def centroid_accumulator(session: Session, weights: np.ndarray, leads: list[float]) -> CentroidAccumulator | None:
    """The centroid scores of ``evaluate.centroid_variable`` (model and persistence), or None
    without one (the default ``tracer`` on a dataset that has none)."""
    name, variables = session.cfg.evaluate.centroid_variable, session.dataset.roles.outputs
    if name is None or (name == "tracer" and name not in variables):
        return None
    if name not in variables:
        raise DatasetError(f"evaluate.centroid_variable = {name}: not an output variable of the model ({variables})")
    xyz = unit_vectors(session.dataset.latitudes, session.dataset.longitudes)[session.points]
    index = variables.index(name)
    mean, stdev = session.dataset.output_mean[index], session.dataset.output_stdev[index]
    threshold = float(mean) + float(stdev)  # mean + 1 stdev
    return CentroidAccumulator(name, index, xyz, weights, leads, ("model", "persistence"), threshold)


def evaluate_skill(session: Session, steps: int, count: int) -> SkillTable:
    """Roll the model out ``steps`` leads from ``count`` validation dates and score it, with
    the baselines of :mod:`training.skill.scores`, on every rank; the same table on every rank."""
    dataset, dims, model = session.dataset, session.dims, session.model
    samples = evaluation_samples(session, steps, count)
    mine = samples[dims.dp_rank :: dims.dp]
    outputs, columns, lead = dataset.roles.outputs, dataset.roles.output_columns(), session.samples.lead
    weights = dataset.area_weights[session.points]
    clims = training_climatologies(session, [t + k * lead for t, _ in mine for k in range(steps + 1)])
    leads = lead_hours(session, steps)
    scores = SkillAccumulator(outputs, leads, ("model", *clims.kinds), weights=weights, climatology=clims.plain)
    centroids = centroid_accumulator(session, weights, leads)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for sample_id, (t, member) in enumerate(mine):
            x, targets, forcings = session.batches([(t, member)], steps)
            forecasts = rollout(
                model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
            )
            initial = dataset.denormalise(dataset.state(t, session.points, member))[:, columns]
            for k, (forecast, target) in enumerate(zip(forecasts, targets)):
                truth = dataset.denormalise_outputs(target[0].cpu().numpy())
                predicted = dataset.denormalise_outputs(forecast[0].cpu().numpy())
                baselines = clims.forecasts(initial, t, t + (k + 1) * lead)
                scores.add("model", k, predicted, truth, sample_id)
                for kind, forecast_of_kind in baselines.items():
                    scores.add(kind, k, forecast_of_kind, truth, sample_id)
                if centroids is not None:
                    centroids.add("model", k, predicted, truth, sample_id)
                    centroids.add("persistence", k, initial, truth, sample_id)
    model.train(was_training)
    table = scores.finalize(dims.mp_group, dims.dp_group)
    if centroids is not None:
        table.centroids = centroids.finalize(dims.mp_group, dims.dp_group, session.hidden.spacing_km)
    return table


def _baselines(
    initial: np.ndarray,
    clim: np.ndarray,
    hourly: dict[float, np.ndarray],
    dates: np.ndarray,
    t: int,
    valid: int,
    seasonal: dict[SeasonalKey, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The baselines' forecasts ``(local points, outputs)`` from date index ``t`` for date index
    ``valid``: persistence, climatology, the hourly climatology at the valid hour, with
    ``seasonal`` the climatology by day of year and hour at the valid date, and the initial
    anomaly persisted (see :mod:`training.skill.scores`).

    The anomaly persisted is the one from the climatology by day of year and hour where it has
    both dates, else from the hourly climatology: its daily cycle is the season's (a summer day's
    swing, not the year's mean swing) and it follows the season over long leads."""
    hour_0, hour_v = (float(h) for h in utc_hours(dates[[t, valid]]))
    at_valid = hourly.get(hour_v, clim)  # an hour no training date has: the plain climatology
    at_start = hourly.get(hour_0, clim)
    out = {"persistence": initial, "climatology": clim, "hourly_climatology": at_valid}
    if seasonal is not None:
        key_0, key_v = seasonal_keys(dates[[t, valid]])
        out[DOY_CLIMATOLOGY] = seasonal.get(key_v, at_valid)  # no training date in its window: the hourly one
        if key_0 in seasonal and key_v in seasonal:
            at_start, at_valid = seasonal[key_0], seasonal[key_v]
    out["anomaly_persistence"] = initial - at_start + at_valid
    return out


def skill_summary(table: SkillTable) -> str:
    """A markdown table of the model's RMSE by lead time beside persistence's, one column per
    variable (``model / persistence``, physical units) and their mean ratio: what a run prints
    at its end."""
    variables = table.variables
    lines = [
        "| lead (h) | " + " | ".join(f"{v}: model / persistence" for v in variables) + " | mean RMSE ratio |",
        "|---:|" + "---:|" * (len(variables) + 1),
    ]
    model = {v: table.rmse("model", v) for v in variables}
    persistence = {v: table.rmse("persistence", v) for v in variables}
    for k, lead in enumerate(table.lead_hours):
        cells = [f"{model[v][k]:.4g} / {persistence[v][k]:.4g}" for v in variables]
        ratio = float(np.mean([model[v][k] / persistence[v][k] for v in variables]))
        lines.append(f"| {lead:g} | " + " | ".join(cells) + f" | {ratio:.3f} |")
    if table.centroids is not None:
        lines.append(table.centroids.to_markdown())
    return "\n".join(lines)
