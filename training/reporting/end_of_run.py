"""What a training run reports at its end: skill by lead time (every rank scores; rank 0 writes
the tables and plots), the loss curve and a map of one forecast of the first validation date."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from training.model.rollout import rollout
from training.reporting.report import final_pictures, report_skill, variable_units
from training.session import Session
from training.skill.by_lead import evaluate_skill
from training.skill.scores import SkillTable

FURTHER_LEADS_H = (24.0, 48.0)  # the centroid variable's extra map rows


def final_report(session: Session, tracker, model_step: int) -> SkillTable | None:
    """Skill by lead time when ``evaluate.at_end_of_training`` (every rank; its table, or
    None), then rank 0's tables, plots (``logging.plots``) and MLflow artifacts of the model
    after ``model_step``."""
    s = session
    dims, ev, plots = s.dims, s.cfg.evaluate, s.cfg.logging.plots
    skill = evaluate_skill(s, ev.steps, ev.samples) if ev.at_end_of_training else None
    if plots and dims.dp_rank == 0:  # replica 0 forecasts one validation date, rank 0 draws it
        part, further = forecast_part(s)
        parts = [part]
        if dims.mp > 1:
            parts = [None] * dims.mp
            torch.distributed.all_gather_object(parts, part, group=dims.mp_group)
        if dims.rank == 0:
            forecast = np.concatenate(parts, axis=1)  # the forecast of samples.val[0], one lead on
            run_dir = Path(s.cfg.run_dir)
            final_pictures(tracker, run_dir, s.dataset, forecast, s.samples.val[0], s.samples.lead, further)
    if skill is not None and dims.rank == 0:
        units = variable_units(s.dataset)
        report_skill(skill, Path(s.cfg.run_dir), tracker, model_step=model_step, units=units, plot=plots)
    return skill


def _further_leads(session: Session) -> list[tuple[str, int]]:
    """``evaluate.centroid_variable`` at :data:`FURTHER_LEADS_H` as ``(variable, leads)``: those
    the first validation sample has truth for (the same on every rank)."""
    dataset, sample = session.dataset, session.samples.val[0]
    name = session.cfg.evaluate.centroid_variable
    lead_h = session.samples.lead * dataset.frequency_s / 3600
    further: list[tuple[str, int]] = []
    if name in dataset.roles.outputs:
        last = dataset.n_times - 1 - sample[0]  # dates of truth after the sample's
        for hours in FURTHER_LEADS_H:
            steps = round(hours / lead_h)
            if steps > 1 and abs(steps * lead_h - hours) < 1e-6 and steps * session.samples.lead <= last:
                further.append((name, steps))
    return further


def forecast_part(session: Session) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """``(2, local points, variables + extra)``: truth and forecast of ``samples.val[0]`` on this
    rank's points one lead on, then the extra columns of :func:`_further_leads`, and those
    extras as ``(variable, leads)``."""
    dataset, sample = session.dataset, session.samples.val[0]
    further = _further_leads(session)
    steps = max([1, *(k for _, k in further)])
    x, targets, forcings = session.batches([sample], steps)
    session.model.eval()
    with torch.no_grad():
        forecasts = rollout(
            session.model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
        )
    session.model.train()
    truth, pred = [targets[0, 0]], [forecasts[0][0]]
    for variable, k in further:
        column = dataset.roles.outputs.index(variable)
        truth.append(targets[k - 1, 0, :, column : column + 1])
        pred.append(forecasts[k - 1][0, :, column : column + 1])
    return np.stack([torch.cat(truth, -1).cpu().numpy(), torch.cat(pred, -1).cpu().numpy()]), further
