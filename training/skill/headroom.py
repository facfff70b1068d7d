"""What a store holds at the first lead beyond the per-point regression: the skill of two
statisticians' forecasts that see every point's inputs at once, scored beside persistence and the
skill table's ``linear_regression`` (one regression per point, on that point's inputs) on the
validation dates the skill table scores.

Both learn what the per-point regression leaves (its forecast plus theirs), from every point's
inputs (the model's input states and the forcings at the valid date, standardised), solved in the
dual (``n x n`` over the training samples), so a grid of any size costs the same per sample:

- ``field_ridge``: a ridge regression, a linear forecast from the whole field;
- ``field_kernel``: a Gaussian (RBF) kernel ridge regression: a non-linear one.

Each output variable's penalty (and the kernel's width) is chosen on the last tenth of the
training samples (by date; the squared error weighed by the points' areas, as scored), then
refitted on them all: nothing is tuned on the validation dates. The per-point regression they
learn over is the skill table's, fitted on every training sample, the held-out tenth too.
Where a trained model does no better than these at the first lead, it has learnt what such a
forecast learns from the store's inputs (docs/real-data.md). Used by ``python -m
training.headroom``; one rank holds every point.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from training.data import DatasetError
from training.data.samples import Sample, evenly_spread
from training.model.dual_ridge import LINEAR, RIDGE_PENALTIES, choose_and_fit, field_kernels, kernels_between
from training.session import Session
from training.skill.area import scored_weights
from training.skill.baselines import Baselines, fit_samples, regression_features, training_baselines
from training.skill.by_lead import evaluation_samples, lead_hours
from training.skill.fitted import LINEAR_REGRESSION
from training.skill.scores import SkillAccumulator, SkillTable

FIELD_KINDS = ("field_ridge", "field_kernel")
MIN_FIT_SAMPLES = 20  # training samples at least: the last tenth of them chooses the penalties
MAX_FIT_SAMPLES = 4096  # the dual systems are n x n: at most 128 MiB each in float64
# Training samples x standardised inputs held at once (512 MiB in float64; the raw inputs read
# take half that again, the validation's are read a chunk at a time).
MAX_FEATURE_VALUES = 2**26
SCORED_CHUNK = 16  # validation samples read at a time
KERNEL_PENALTIES = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)  # the RBF kernel's diagonal is 1


@dataclass
class FieldData:
    """Every point's inputs ``features (samples, points x inputs)`` and normalised next states
    ``targets (samples, points x outputs)`` of a list of samples."""

    features: np.ndarray
    targets: np.ndarray
    regression: np.ndarray  # the per-point regression's forecasts of the targets, normalised


def field_data(session: Session, baselines: Baselines, samples: list[Sample]) -> FieldData:
    """The inputs the regression per point reads (the model's input and the valid date's forcings,
    :class:`training.skill.baselines.Baselines`), of every point; the first lead's states and the
    per-point regression's forecasts of them, normalised."""
    dataset, lead = session.dataset, session.samples.lead
    columns, regression = dataset.roles.output_columns(), baselines.fitted.regressions[0]
    features, targets, forecasts = [], [], []
    for t, member in samples:
        (row,) = regression_features(session, t, member, 1)[1]
        features.append(row.ravel())
        targets.append(dataset.state(t + lead, session.points, member)[:, columns].ravel())
        forecasts.append(regression.predict(row).ravel())
    as_array = functools.partial(np.array, dtype=np.float64)
    return FieldData(np.stack(features), as_array(targets), as_array(forecasts))


class FieldForecasts:
    """``field_ridge`` and ``field_kernel`` fitted on ``starts`` (training samples, in date order)
    over what the per-point regression of ``baselines`` leaves of them (see the module): each
    variable's penalty chosen by the squared error weighed by the points' ``weights``."""

    def __init__(self, session: Session, baselines: Baselines, starts: list[Sample], weights: np.ndarray) -> None:
        width = field_data(session, baselines, starts[:1]).features.shape[1]
        count = min(len(starts), MAX_FIT_SAMPLES, MAX_FEATURE_VALUES // width)
        train = field_data(session, baselines, evenly_spread(starts, max(count, MIN_FIT_SAMPLES)))
        mean, stdev = train.features.mean(axis=0), train.features.std(axis=0)
        self.kept = stdev > 1e-6 * max(float(stdev.max()), 1e-30)  # constant inputs (positions) say nothing
        self.mean, self.stdev = mean[self.kept], stdev[self.kept]
        self.train = self._standardise(train.features)
        del train.features
        self.norms = np.einsum("ij,ij->i", self.train, self.train)
        gram = self.train @ self.train.T
        residual = train.targets - train.regression
        outputs = len(session.dataset.roles.outputs)
        variables = np.arange(residual.shape[1]) % outputs  # the columns are point-major
        column_weights = np.repeat(weights, outputs)
        penalties = tuple(p * (float(self.norms.mean()) or 1.0) for p in RIDGE_PENALTIES)
        kernels = field_kernels(gram, self.norms)
        self.ridge = choose_and_fit({LINEAR: kernels.pop(LINEAR)}, residual, penalties, variables, column_weights)
        self.kernel = choose_and_fit(kernels, residual, KERNEL_PENALTIES, variables, column_weights)

    def _standardise(self, features: np.ndarray) -> np.ndarray:
        return (features[:, self.kept] - self.mean) / self.stdev

    def forecasts(self, data: FieldData) -> dict[str, np.ndarray]:
        """Each kind's normalised forecast ``(samples, points x outputs)`` of ``data``'s samples."""
        keys = [LINEAR, *(c.key for c in self.kernel.choices)]
        kernels = kernels_between(self._standardise(data.features), self.train, self.norms, keys)
        return {
            "field_ridge": data.regression + self.ridge.predict({LINEAR: kernels[LINEAR]}),
            "field_kernel": data.regression + self.kernel.predict(kernels),
        }

    def describe(self, variables: list[str]) -> str:
        """The chosen penalties (and widths) per variable, as the log says them."""
        parts = [
            f"{v}: ridge penalty {r.penalty:.3g}, kernel gamma {k.key:.3g} penalty {k.penalty:.3g}"
            for v, r, k in zip(variables, self.ridge.choices, self.kernel.choices)
        ]
        return f"fitted on {len(self.train)} training samples of {self.train.shape[1]:,} inputs; " + "; ".join(parts)


def headroom_table(session: Session, steps: int, count: int) -> tuple[SkillTable, FieldForecasts, int]:
    """Persistence, the skill table's per-point regression and :data:`FIELD_KINDS` scored at the
    first lead on the ``count`` validation samples the skill table scores (with ``steps`` leads),
    on one rank that holds every point."""
    dataset, lead = session.dataset, session.samples.lead
    outputs, columns = dataset.roles.outputs, dataset.roles.output_columns()
    samples, starts = evaluation_samples(session, steps, count), fit_samples(session, steps)
    if len(starts) < MIN_FIT_SAMPLES:
        raise DatasetError(
            f"evaluate.steps = {steps}: {len(starts)} training samples have targets that many leads on; "
            f"python -m training.headroom needs {MIN_FIT_SAMPLES}: lower evaluate.steps or data.val_fraction"
        )
    baselines = training_baselines(session, steps, [t + k * lead for t, _ in samples for k in (0, 1)], leads=1)
    weights = scored_weights(session)
    fields = FieldForecasts(session, baselines, starts, weights)
    kinds = ("persistence", LINEAR_REGRESSION, *FIELD_KINDS)
    scores = SkillAccumulator(outputs, lead_hours(session, 1), kinds, weights, baselines.climatologies.plain)
    shape = (-1, len(outputs))  # a sample's (points, outputs)
    for first in range(0, len(samples), SCORED_CHUNK):
        chunk = samples[first : first + SCORED_CHUNK]
        valid = field_data(session, baselines, chunk)
        by_kind = {LINEAR_REGRESSION: valid.regression, **fields.forecasts(valid)}
        for i, (t, member) in enumerate(chunk):
            truth = dataset.denormalise_outputs(valid.targets[i].reshape(shape))
            initial = dataset.denormalise(dataset.state(t, session.points, member))[:, columns]
            scores.add("persistence", 0, initial, truth, first + i)
            for kind, forecast in by_kind.items():
                scores.add(kind, 0, dataset.denormalise_outputs(forecast[i].reshape(shape)), truth, first + i)
    return scores.finalize(None, None), fields, len(samples)


def headroom_markdown(table: SkillTable, fields: FieldForecasts, samples: int) -> str:
    """Each output variable's RMSE of every kind at the first lead, and the field forecasts'
    margin over the per-point regression."""
    lines = [
        f"RMSE at {table.lead_hours[0]:g} h on {samples} validation samples ({fields.describe(table.variables)}).",
        "",
        "| variable | persistence | linear_regression | field_ridge | field_kernel "
        "| field_ridge over linear_regression | field_kernel over linear_regression |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in table.variables:
        rmse = {k: table.rmse(k, v)[0] for k in ("persistence", LINEAR_REGRESSION, *FIELD_KINDS)}
        gains = [f"{(1 - rmse[k] / rmse[LINEAR_REGRESSION]) * 100:+.1f}%" for k in FIELD_KINDS]
        lines.append(f"| {v} | " + " | ".join(f"{r:.4g}" for r in rmse.values()) + " | " + " | ".join(gains) + " |")
    return "\n".join(lines)
