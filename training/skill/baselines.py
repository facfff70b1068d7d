"""Every baseline a forecast is scored beside, on one rank's points: the simple ones of the
training period's climatologies (:mod:`training.skill.climatologies`) and the two a
statistician fits on the training dates (:mod:`training.skill.fitted`). What the skill table at
the end of a run and the validation's best baseline both forecast with."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from training.data import DatasetError
from training.data.open_store import dataset_samples
from training.data.samples import Sample, evenly_spread
from training.session import Session
from training.skill.climatologies import Climatologies, date_count, training_climatologies
from training.skill.fitted import FittedBaselines, fit_baselines


@dataclass
class Baselines:
    """The baselines of ``session``'s points for leads 1 to ``steps``."""

    session: Session
    steps: int
    climatologies: Climatologies
    fitted: FittedBaselines | None  # None: no training sample has targets that many leads on

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.climatologies.kinds + (self.fitted.kinds if self.fitted is not None else ())

    def forecasts(self, t: int, member: int) -> list[dict[str, np.ndarray]]:
        """Per lead (1 to ``steps``), each baseline's forecast ``(local points, outputs)`` in
        physical units from date index ``t`` of ``member``."""
        s, dataset = self.session, self.session.dataset
        columns, lead = dataset.roles.output_columns(), s.samples.lead
        initial = dataset.denormalise(dataset.state(t, s.points, member))[:, columns]
        features = None
        if self.fitted is not None and self.fitted.regressions is not None:
            features = regression_features(s, t, member, self.steps)[1]
        out = []
        for k in range(self.steps):
            valid = t + (k + 1) * lead
            forecasts = self.climatologies.forecasts(initial, t, valid)
            if self.fitted is not None:
                at_start, at_valid = self.climatologies.anomaly_reference(t, valid)
                row = None if features is None else features[k]
                forecasts |= self.fitted.forecasts(k, row, initial - at_start, at_valid, dataset.denormalise_outputs)
            out.append(forecasts)
        return out


def regression_features(session: Session, t: int, member: int, steps: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The model's input ``(local points, inputs)`` from date index ``t`` of ``member`` and, per lead
    (1 to ``steps``), what the regression of that lead reads ``(local points, features)``: the
    input and the valid date's forcings."""
    batches = session.batches
    x = batches.forecast_inputs(t, member, 1)[0][0].cpu().numpy()
    return x, [np.concatenate([x, forcings[0]], axis=-1) for forcings in batches.valid_forcings([(t, member)], steps)]


def fit_samples(session: Session, steps: int) -> list[Sample]:
    """The training samples the fitted baselines read: of those with targets ``steps`` leads on
    (every training sample has one lead), as many as
    :func:`~training.skill.climatologies.date_count` allows, evenly spread (every one on a small
    enough grid, as a statistician fits); none where no training sample has them."""
    train = session.samples.train
    if steps > 1:
        history = session.cfg.model.multistep_input - 1
        try:
            train = dataset_samples(session.cfg.data, session.dataset, steps, history).train
        except DatasetError:
            return []
    return evenly_spread(train, date_count(session.dataset.n_points))


def calibration_period_samples(session: Session, steps: int) -> list[Sample]:
    """The samples of the calibration period (``data.calibration_fraction``) with targets
    ``steps`` leads on, none without the period or where it is shorter than that."""
    if not session.cfg.data.calibration_fraction:
        return []
    history = session.cfg.model.multistep_input - 1
    try:
        return dataset_samples(session.cfg.data, session.dataset, steps, history).calibration
    except DatasetError:
        return []


def training_baselines(session: Session, steps: int, dates: Iterable[int], leads: int | None = None) -> Baselines:
    """The :class:`Baselines` of ``session``'s training period for leads 1 to ``leads`` (None:
    ``steps``), fitted on the samples of ``steps`` leads (:func:`fit_samples`: the same fit of a
    lead for any ``leads``), scored at the date indices ``dates`` (initial and valid: the
    climatology by day of year is computed for those and the fit's own dates only)."""
    starts, leads = fit_samples(session, steps), leads or steps
    lead = session.samples.lead
    fit_dates = [t + k * lead for t, _ in starts for k in range(leads + 1)]
    climatologies = training_climatologies(session, [*dates, *fit_dates])
    fitted = fit_baselines(session, leads, climatologies, starts) if starts else None
    return Baselines(session, leads, climatologies, fitted)
