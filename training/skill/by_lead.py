"""Skill by lead time of a forecaster, sharded like training: the area-weighted RMSE and the
anomaly correlation per output variable and lead, beside persistence, climatology, the hourly
climatology, anomaly persistence, when the training period spans a year the climatology by day
of year and hour, and the two baselines fitted on the training dates, linear regression and
damped persistence (:mod:`training.skill.baselines`).

Initial dates are spread evenly over the validation period; data-parallel replicas take
turns with them, and every rank scores its own block of points (see
:class:`training.skill.scores.SkillAccumulator`). Used at the end of a training run and by
``python -m training.evaluate``.
"""

from __future__ import annotations

import logging

import numpy as np

from processor.geometry import unit_vectors
from training.data import DatasetError
from training.data.open_store import dataset_samples
from training.data.samples import Sample, evenly_spread
from training.session import Session
from training.skill.area import scored_weights
from training.skill.baselines import training_baselines
from training.skill.calibration import UNCALIBRATED, calibration_samples, describe, fit_calibration
from training.skill.centroid import CentroidAccumulator
from training.skill.field_leads import fit_field_leads
from training.skill.rolled_out import rolled_out
from training.skill.scores import SkillAccumulator, SkillTable

log = logging.getLogger(__name__)


def evaluation_samples(session: Session, steps: int, count: int) -> list[Sample]:
    """Up to ``count`` validation samples with targets ``steps`` leads on, evenly spread."""
    try:
        val = dataset_samples(session.cfg.data, session.dataset, steps, session.cfg.model.multistep_input - 1).val
    except DatasetError as exc:
        raise DatasetError(f"evaluate.steps = {steps}: {exc}") from None
    return evenly_spread(val, count)


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
    dataset, dims = session.dataset, session.dims
    samples = evaluation_samples(session, steps, count)
    mine = samples[dims.dp_rank :: dims.dp]
    outputs, columns, lead = dataset.roles.outputs, dataset.roles.output_columns(), session.samples.lead
    weights = scored_weights(session)
    calibrate = session.cfg.evaluate.calibrate
    calibrated_on = calibration_samples(session, steps) if calibrate else []  # their climatologies too
    dates = [t + k * lead for t, _ in [*mine, *calibrated_on] for k in range(steps + 1)]
    baselines = training_baselines(session, steps, dates)
    leads = lead_hours(session, steps)
    plain = baselines.climatologies.plain
    fields = fit_field_leads(session, baselines) if calibrate else None
    calibration = fit_calibration(session, baselines, fields) if calibrate else None
    if calibration and dims.rank == 0:
        log.info(describe(calibration, outputs, leads))
    kinds = ("model", *((UNCALIBRATED,) if calibration else ()), *baselines.kinds)
    scores = SkillAccumulator(outputs, leads, kinds, weights=weights, climatology=plain)
    centroids = centroid_accumulator(session, weights, leads)
    for sample_id, done in enumerate(rolled_out(session, mine, steps)):
        t, member = done.sample
        initial = dataset.denormalise(dataset.state(t, session.points, member))[:, columns]
        by_lead = baselines.forecasts(t, member)
        weighed = fields.with_maps(t, member, by_lead) if fields is not None and calibration else by_lead
        for k, (predicted, truth) in enumerate(zip(done.forecasts, done.truths)):
            if calibration:
                scores.add(UNCALIBRATED, k, predicted, truth, sample_id)
                predicted = calibration[k].apply(predicted, weighed[k])
            scores.add("model", k, predicted, truth, sample_id)
            for kind, forecast_of_kind in by_lead[k].items():
                scores.add(kind, k, forecast_of_kind, truth, sample_id)
            if centroids is not None:
                centroids.add("model", k, predicted, truth, sample_id)
                centroids.add("persistence", k, initial, truth, sample_id)
    table = scores.finalize(dims.mp_group, dims.dp_group)
    if centroids is not None:
        table.centroids = centroids.finalize(dims.mp_group, dims.dp_group, session.hidden.spacing_km)
    return table


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
