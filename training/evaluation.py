"""Skill by lead time of a forecaster, sharded like training: the area-weighted RMSE and the
anomaly correlation per variable and lead, beside persistence and climatology.

Initial dates are spread evenly over the validation period; data-parallel replicas take
turns with them, and every rank scores its own block of points (see
:class:`training.skill.SkillAccumulator`). Used at the end of a training run and by
``python -m training.evaluate``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from training.data import DatasetError
from training.data.samples import Sample
from training.rollout import rollout
from training.session import Session, dataset_samples
from training.skill import SkillAccumulator, SkillTable, _metric_part, area_weights, climatology

log = logging.getLogger(__name__)

CLIMATOLOGY_DATES = 365  # training dates averaged into the climatology, at most (evenly spread)


def evenly_spread(items: list, count: int) -> list:
    """At most ``count`` of ``items``, evenly spread from the first to the last, in order."""
    picks = np.unique(np.linspace(0, len(items) - 1, min(count, len(items))).round().astype(int))
    return [items[i] for i in picks]


def evaluation_samples(session: Session, steps: int, count: int) -> list[Sample]:
    """Up to ``count`` validation samples with targets ``steps`` leads on, evenly spread."""
    try:
        val = dataset_samples(session.cfg, session.dataset, horizon=steps).val
    except DatasetError as exc:
        raise DatasetError(f"evaluate.steps = {steps}: {exc}") from None
    return evenly_spread(val, count)


def climatology_dates(session: Session) -> list[int]:
    """Start dates of the training period (at most :data:`CLIMATOLOGY_DATES`, evenly spread)."""
    dates = sorted({t for t, _ in session.samples.train})
    return evenly_spread(dates, CLIMATOLOGY_DATES)


def lead_hours(session: Session, steps: int) -> list[float]:
    step_h = session.samples.lead * session.dataset.frequency_s / 3600
    return [step_h * (k + 1) for k in range(steps)]


def evaluate_skill(session: Session, steps: int, count: int) -> SkillTable:
    """Roll the model out ``steps`` leads from ``count`` validation dates and score it, with
    persistence and climatology, on every rank; the same table on every rank."""
    dataset, dims, model = session.dataset, session.dims, session.model
    samples = evaluation_samples(session, steps, count)
    mine = samples[dims.dp_rank :: dims.dp]
    weights = area_weights(dataset.latitudes, session.cfg["data"]["grid"])[session.points]
    clim = climatology(dataset, climatology_dates(session), session.points)
    scores = SkillAccumulator(dataset.variables, lead_hours(session, steps), weights=weights, climatology=clim)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for sample_id, sample in enumerate(mine):
            x, targets = session.batches([sample], steps)
            forecasts = rollout(model, x, steps, session.grids, session.model_group, session.transport)
            initial = dataset.denormalise(x[0].cpu().numpy())
            for k, (forecast, target) in enumerate(zip(forecasts, targets)):
                truth = dataset.denormalise(target[0].cpu().numpy())
                scores.add("model", k, dataset.denormalise(forecast[0].cpu().numpy()), truth, sample_id)
                scores.add("persistence", k, initial, truth, sample_id)
                scores.add("climatology", k, clim, truth, sample_id)
    model.train(was_training)
    return scores.finalize(dims.mp_group, dims.dp_group)


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
    return "\n".join(lines)


def lead_labels(lead_hours: list[float]) -> dict[float, str]:
    """Each lead as it appears in a metric's name: ``024h``, zero-padded so that names sort by
    lead (``006h`` before ``024h``); with two decimals when a lead is not a whole hour."""
    decimals = 0 if all(float(h).is_integer() for h in lead_hours) else 2
    width = 3 + (decimals + 1 if decimals else 0)
    return {h: f"{h:0{width}.{decimals}f}h" for h in lead_hours}


def evaluation_metrics(table: SkillTable) -> dict[str, float]:
    """One evaluation as MLflow metrics, the lead in each name: ``eval/rmse/<variable>/<kind>/<lead>``
    and ``eval/acc/<variable>/<kind>/<lead>`` for every row of the table (``skill.csv``; NaN left
    out: no samples, climatology's ACC), and ``eval/rmse/<variable>/model_over_persistence/<lead>``,
    the model's RMSE over persistence's (below 1: better than persistence)."""
    labels = lead_labels(table.lead_hours)
    out: dict[str, float] = {}
    for r in table.rows:
        for name, value in (("rmse", r.rmse), ("acc", r.acc)):
            if math.isfinite(value):
                out[f"eval/{name}/{_metric_part(r.variable)}/{r.kind}/{labels[r.lead_h]}"] = float(value)
    if {"model", "persistence"} <= set(table.kinds):
        for var in table.variables:
            model, persistence = table.rmse("model", var), table.rmse("persistence", var)
            for lead, m, p in zip(table.lead_hours, model, persistence):
                ratio = m / p if p > 0 else math.nan
                if math.isfinite(ratio):
                    out[f"eval/rmse/{_metric_part(var)}/model_over_persistence/{labels[lead]}"] = ratio
    return out


def report_skill(table: SkillTable, directory: Path, tracker, model_step: int | None = None) -> str:
    """Write the table (``skill.md``, ``skill.csv``) and its plot (``rmse_by_lead.png``) to
    ``directory``, log them as artifacts and the scores as one evaluation with ``tracker``
    (:func:`evaluation_metrics`, all at ``model_step``: the training step of the model scored,
    its checkpoint's step); return the table as markdown.

    ``model_step`` None (a caller not yet passing it): the step after the last training step
    recorded in ``directory``'s ``metrics.jsonl`` (0 if none), with a warning.
    """
    from training.metrics_file import read_history
    from training.plots import rmse_by_lead

    if model_step is None:
        history = read_history(directory)
        model_step = history[-1][0] + 1 if history else 0
        log.warning("report_skill without model_step: logging the evaluation at step %d", model_step)
    directory.mkdir(parents=True, exist_ok=True)
    text = f"Model after training step {model_step}.\n\n" + table.to_markdown()
    (directory / "skill.md").write_text(text + "\n")
    table.to_csv(directory / "skill.csv")
    tracker.log_evaluation(model_step, evaluation_metrics(table))
    for path in (directory / "skill.md", directory / "skill.csv", rmse_by_lead(table, directory / "rmse_by_lead.png")):
        tracker.log_artifact(path)
    return text
