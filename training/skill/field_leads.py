"""The field map of every lead, a forecast the calibration (:mod:`training.skill.calibration`)
weighs beside the model: at lead ``k``, the skill table's per-point regression of that lead plus a
kernel ridge map of what it leaves, fitted directly to that lead's states from **every point's
inputs at once** (the model's input, as :mod:`training.model.field_forecast` reads it). It is the
field forecast the network is given for one step (``model.field_input``), fitted for each lead
directly, as a statistician fits a forecast per lead: where the rolled-out model has lost its
skill, the direct forecast of the whole field keeps some (docs/real-data.md).

Each output variable's kernel and penalty are chosen per lead on the last tenth of the fitted
samples (:func:`~training.model.dual_ridge.choose_and_fit`), up to
:data:`~training.model.field_forecast.MAX_FIELD_SAMPLES` training samples evenly spread. Weighed
only where the run holds a calibration period out of training (``data.calibration_fraction``):
fitted on the training dates, a map of thousands of inputs forecasts them better than it does
new dates, and weights fitted there would trust it too much. So the calibration and the skill
table see it only on dates it was not fitted on.

Fitted where one rank holds every point and the store has the training samples the field input
needs (:func:`~training.model.field_forecast.field_samples_that_fit`); elsewhere there is none,
and the calibration weighs the model and damped persistence alone. Every data-parallel replica
fits the same maps from the same samples: no communication, for a fit of seconds."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from training.data.open_store import dataset_samples
from training.data.samples import Sample, evenly_spread
from training.model.dual_ridge import (
    RIDGE_PENALTIES,
    Kernels,
    PerVariableFit,
    choose_and_fit,
    field_kernels,
    held_out_spectra,
    kernels_between,
)
from training.model.field_forecast import field_samples_that_fit, standardised_inputs
from training.model.ridge import RidgeFit
from training.session import Session
from training.skill.baselines import Baselines, calibration_period_samples, regression_features
from training.skill.fitted import LINEAR_REGRESSION

log = logging.getLogger(__name__)

FIELD_MAP = "field_map"  # the calibration's name for this forecast


@dataclass
class Inputs:
    """Samples' inputs: ``flat (samples, points x inputs)`` every point's, and ``per_lead`` the
    per-point regression's features ``(samples, points, features)`` of each lead."""

    flat: np.ndarray
    per_lead: list[np.ndarray]


def read_inputs(session: Session, samples: list[Sample], steps: int) -> Inputs:
    """The model's input of each of ``samples`` and, per lead, what the regression of that lead
    reads (the input and the valid date's forcings, :class:`training.skill.baselines.Baselines`)."""
    flat, per_lead = [], [[] for _ in range(steps)]
    for t, member in samples:
        x, features = regression_features(session, t, member, steps)
        flat.append(x.ravel())
        for k, row in enumerate(features):
            per_lead[k].append(row)
    return Inputs(np.array(flat, dtype=np.float64), [np.stack(rows) for rows in per_lead])


def regression_forecasts(regression: RidgeFit, features: np.ndarray) -> np.ndarray:
    """``(samples, points x outputs)`` the normalised forecasts of ``features (samples, points, f)``."""
    return np.stack([regression.predict(row).ravel() for row in features]).astype(np.float64)


class FieldLeads:
    """The field map of each lead fitted on the training samples ``starts`` of ``session`` over
    ``baselines``' regressions (see the module)."""

    def __init__(self, session: Session, baselines: Baselines, starts: list[Sample]) -> None:
        steps, self.session = baselines.steps, session
        self.regressions = baselines.fitted.regressions
        self.outputs = len(session.dataset.roles.outputs)
        fitted = read_inputs(session, starts, steps)
        self.kept, self.mean, self.scale, self.samples = standardised_inputs(fitted.flat)
        self.norms = np.einsum("ij,ij->i", self.samples, self.samples)
        kernels = field_kernels(self.samples @ self.samples.T, self.norms)
        spectra = held_out_spectra(kernels)  # the same samples for every lead
        self.maps: list[PerVariableFit] = []
        for k in range(steps):
            left = self._states(starts, k) - regression_forecasts(self.regressions[k], fitted.per_lead[k])
            variables = np.arange(left.shape[1]) % self.outputs  # the columns are point-major
            self.maps.append(choose_and_fit(kernels, left, RIDGE_PENALTIES, variables, spectra=spectra))
        gains = ", ".join("/".join(f"{100 * c.gain:.1f}" for c in fit.choices) for fit in self.maps)
        log.info("field map of each lead: %s%% of the held-out error off the regression's", gains)

    def _states(self, samples: list[Sample], k: int) -> np.ndarray:
        """``(samples, points x outputs)`` the normalised states ``k + 1`` leads after ``samples``."""
        session = self.session
        dataset, columns, lead = session.dataset, session.dataset.roles.output_columns(), session.samples.lead
        return np.stack([dataset.state(t + (k + 1) * lead, session.points, m)[:, columns].ravel() for t, m in samples])

    def _kernels(self, flat: np.ndarray) -> Kernels:
        """The kernels the maps chose, ``(samples, fitted samples)`` between the inputs ``flat``
        and the fitted samples'."""
        keys = {choice.key for fit in self.maps for choice in fit.choices}
        return kernels_between((flat[:, self.kept] - self.mean) / self.scale, self.samples, self.norms, keys)

    def with_maps(self, t: int, member: int, by_lead: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """``by_lead``, the baselines' forecasts of each lead from date index ``t`` of ``member``
        (:meth:`training.skill.baselines.Baselines.forecasts`, the regression's among them), each
        with the field map's ``(points, outputs)`` in physical units: the regression's forecast
        plus the map of the model's input."""
        x = self.session.batches.forecast_inputs(t, member, 1)[0][0].cpu().numpy()
        kernels, stdev = self._kernels(x.reshape(1, -1).astype(np.float64)), self.session.dataset.output_stdev
        return [
            given | {FIELD_MAP: given[LINEAR_REGRESSION] + fit.predict(kernels)[0].reshape(-1, self.outputs) * stdev}
            for given, fit in zip(by_lead, self.maps, strict=True)
        ]


def fit_field_leads(session: Session, baselines: Baselines) -> FieldLeads | None:
    """:class:`FieldLeads` of ``session`` over ``baselines``; None where there is no calibration
    period, one rank does not hold every point, there is no regression, or the store has too few
    training samples for the fit (see the module)."""
    fitted = baselines.fitted
    if session.dims.mp > 1 or fitted is None or fitted.regressions is None:
        return None
    if not calibration_period_samples(session, baselines.steps):
        return None
    history = session.cfg.model.multistep_input - 1
    train = dataset_samples(session.cfg.data, session.dataset, baselines.steps, history).train
    x = session.batches.forecast_inputs(*train[0], 1)[0][0]
    outputs = len(session.dataset.roles.outputs)
    count = field_samples_that_fit(x.shape[0], x.shape[1], outputs, len(train))
    return FieldLeads(session, baselines, evenly_spread(train, count)) if count else None
