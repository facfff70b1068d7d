"""The model's forecast calibrated per lead, as forecasters post-process a model's output (model
output statistics): at each lead and for each output variable,

    calibrated = c + a (model - c) + b (damped_persistence - c) [+ f (field_map - c)]

with ``c`` the climatology (plain, by hour of day or by day of year) that fits the calibration
samples best at that lead, and ``a``, ``b`` (and ``f``) the least-squares weights over their
points (area-weighted) and samples among the blends: every weight >= 0 and their sum <= 1, the
rest on ``c`` (:func:`blend_weights`). At the first leads ``a`` is 1 or near it: the model is
kept as it is. Where the rolled-out model has lost its skill, the weights move the forecast
toward the climatology, the damped persistence fitted for that lead and, where there is one, the
field map fitted directly for that lead (:mod:`training.skill.field_leads`), as a deterministic
forecast should when the model's predictability is gone.

Fitted on :func:`calibration_count` samples (at most :data:`CALIBRATION_SAMPLES`; fewer on a
large grid), evenly spread over the **calibration period** where the run holds one out
(``data.calibration_fraction``: the dates just before validation, on which neither the model
nor the baselines nor the field maps are fitted), else over the training samples the fitted
baselines read (:func:`training.skill.baselines.fit_samples`). Fitted on training dates, the
weights trust the model's later leads as if it had not learnt those dates (docs/real-data.md):
the field map is weighed only where the period is held out. No validation date is seen. Every
rank rolls out its replica's share of them on its points; the sums are added over the model and
data-parallel groups, so every rank solves the same weights."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from training.data.samples import Sample, evenly_spread
from training.session import Session
from training.skill.area import scored_weights
from training.skill.baselines import Baselines, calibration_period_samples, fit_samples
from training.skill.climatologies import POINT_DATES
from training.skill.field_leads import FIELD_MAP, FieldLeads
from training.skill.fitted import DAMPED_PERSISTENCE
from training.skill.rolled_out import rolled_out
from training.skill.scores import sum_over

log = logging.getLogger(__name__)

CALIBRATION_SAMPLES = 512  # training samples rolled out for the fit, at most (evenly spread; 128 weighed
# noisily on the real stores, of 11 to 1,617 points)
# Fewer on a large grid, where the rollouts are the cost: at most as many samples x data points as
# the baselines' statistics read (climatologies.POINT_DATES, 2^22), 128 samples at least. Every
# store of up to 8,192 points keeps 512; a global 1-degree grid's 64,800 roll out 128 (at 512, 7
# of the 18 minutes of the README's command on a 2-core host, docs/real-data.md). Measured on one
# synthetic global store only, where 128 and 512 gave the same skill table: a grid's points on the
# same dates are correlated, and do not stand for dates.
MIN_CALIBRATION_SAMPLES = 128
REFERENCES = ("climatology", "hourly_climatology", "doy_climatology")  # the anchors c it chooses from
# The baselines weighed beside the model, where scored. The regression weighed too (and the fit on
# training samples it was not fitted on) scored worse on three of the four real stores.
WEIGHED = (DAMPED_PERSISTENCE,)
TOLERANCE = 1e-9  # how far past the blends' bounds rounding may put a face's least-squares point
MODEL = "model"
UNCALIBRATED = "model_uncalibrated"  # the skill table's kind for the model's own forecast


@dataclass(frozen=True)
class LeadCalibration:
    """One lead's weights per output variable: its reference climatology and the weight of each
    forecast of ``kinds`` (the model first) about it."""

    kinds: tuple[str, ...]  # the model, then the baselines weighed
    references: tuple[str, ...]  # (variables,)
    weights: np.ndarray  # (variables, kinds)

    def apply(self, forecast: np.ndarray, baselines: dict[str, np.ndarray]) -> np.ndarray:
        """``(points, variables)`` the calibrated forecast of the model's ``forecast`` ``(points,
        variables)``, physical units, with the same lead's baseline forecasts ``baselines``."""
        given = {MODEL: forecast, **baselines}
        out = np.empty_like(forecast)
        for v, reference in enumerate(self.references):
            c = baselines[reference][:, v]
            out[:, v] = c + sum(w * (given[kind][:, v] - c) for kind, w in zip(self.kinds, self.weights[v]))
        return out


def describe(calibration: list[LeadCalibration], variables: list[str], lead_hours: list[float]) -> str:
    """One line per lead: each variable's weights and reference, as the run's log shows them."""
    lines = []
    for lead, cal in zip(lead_hours, calibration):
        cells = [
            f"{v} " + " ".join(f"{k}={w:.2f}" for k, w in zip(cal.kinds, weights)) + f" about {reference}"
            for v, reference, weights in zip(variables, cal.references, cal.weights)
        ]
        lines.append(f"calibration at {lead:g} h: " + "; ".join(cells))
    return "\n".join(lines)


def products(forecasts: list[np.ndarray], truth: np.ndarray, c: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``(n + 1, n + 1, variables)``: the area-weighted sums over points of the products of the
    anomalies from ``c`` of the ``n`` ``forecasts`` and then ``truth`` (all ``(points,
    variables)``; ``w`` ``(points,)``), over the points where every one is finite."""
    z = np.stack([f - c for f in forecasts] + [truth - c])  # (n + 1, points, variables)
    z = np.where(np.isfinite(z).all(axis=0), z, 0.0)  # a store's missing values count nowhere
    return np.einsum("ipv,jpv,p->ijv", z, z, w)


def solve(sums: np.ndarray, references: tuple[str, ...], kinds: tuple[str, ...]) -> LeadCalibration:
    """One lead's weights from its sums ``(references, n + 1, n + 1, variables)``: per variable
    the reference whose own squared error is least, then the blend weights about it
    (:func:`blend_weights`)."""
    n, chosen, weights = len(kinds), [], []
    for v in range(sums.shape[-1]):
        r = int(np.argmin(sums[:, n, n, v]))
        weights.append(blend_weights(sums[r, :n, :n, v], sums[r, :n, n, v]))
        chosen.append(references[r])
    return LeadCalibration(kinds, tuple(chosen), np.array(weights))


def blend_weights(gram: np.ndarray, cross: np.ndarray) -> np.ndarray:
    """``(n,)`` the weights ``w`` of ``n`` forecasts' anomalies that minimise the squared error
    ``w' gram w - 2 w' cross`` (``gram`` ``(n, n)``: the anomalies' products; ``cross`` ``(n,)``:
    theirs with the truth's) over the blends: every weight >= 0 and their sum <= 1, the rest on
    the reference climatology. Unbounded least squares on the training dates, where the model
    fits the weather it learnt, weighs the model's anomaly over 1 and damped persistence's below
    0 at the first leads; on other dates that extrapolation costs. The minimum of this convex
    problem is the least-squares point of one face of the region: every face is tried."""
    n, scale = len(cross), float(np.abs(np.diag(gram)).max(initial=0.0))
    best, best_error = np.zeros(n), 0.0  # the climatology alone
    if scale == 0.0:
        return best
    # in a variable's squared units (Pa^2 over many points) the sum's row of the KKT system would be lost
    gram, cross = gram / scale, cross / scale
    for mask in range(1, 2**n):
        free = [i for i in range(n) if mask >> i & 1]
        g, c = gram[np.ix_(free, free)], cross[free]
        on_face = [np.linalg.lstsq(g, c, rcond=None)[0]]
        kkt = np.block([[g, np.ones((len(free), 1))], [np.ones((1, len(free))), np.zeros((1, 1))]])
        on_face.append(np.linalg.lstsq(kkt, np.append(c, 1.0), rcond=None)[0][:-1])  # the weights summing to 1
        for w_free in on_face:
            if (w_free >= -TOLERANCE).all() and w_free.sum() <= 1 + TOLERANCE:  # inside, up to rounding
                w = np.zeros(n)
                w[free] = np.clip(w_free, 0.0, None)
                w /= max(1.0, w.sum())
                error = w @ gram @ w - 2 * w @ cross
                if error < best_error:
                    best, best_error = w, error
    return best


def calibration_count(n_points: int) -> int:
    """How many samples the calibration rolls out on a grid of ``n_points`` data points."""
    return min(CALIBRATION_SAMPLES, max(MIN_CALIBRATION_SAMPLES, POINT_DATES // n_points))


def calibration_samples(session: Session, steps: int) -> list[Sample]:
    """The samples the calibration for leads 1 to ``steps`` rolls out, at most
    :func:`calibration_count` evenly spread: of the calibration period where there is one, else
    of the training samples the fitted baselines read (:func:`training.skill.baselines.fit_samples`)."""
    held_out = calibration_period_samples(session, steps)
    if held_out:
        return evenly_spread(held_out, calibration_count(session.dataset.n_points))
    if session.cfg.data.calibration_fraction:
        log.warning(
            "data.calibration_fraction = %g: the period holds no sample with %d leads; calibrated on training dates",
            session.cfg.data.calibration_fraction,
            steps,
        )
    return evenly_spread(fit_samples(session, steps), calibration_count(session.dataset.n_points))


def fit_calibration(
    session: Session, baselines: Baselines, fields: FieldLeads | None = None
) -> list[LeadCalibration] | None:
    """Per lead (1 to ``baselines.steps``), the calibration of ``session``'s model fitted on
    :func:`calibration_samples` (whose dates' climatologies ``baselines`` holds), with the field
    maps ``fields`` weighed beside the model where given; None without samples (every rank
    agrees: they are the same everywhere)."""
    dataset, dims, steps = session.dataset, session.dims, baselines.steps
    samples = calibration_samples(session, steps) if baselines.fitted is not None else []
    if not samples:
        return None
    references = tuple(r for r in REFERENCES if r in baselines.kinds)
    kinds = (MODEL, *(k for k in WEIGHED if k in baselines.kinds), *((FIELD_MAP,) if fields is not None else ()))
    weights = scored_weights(session)
    sums = np.zeros((steps, len(references), len(kinds) + 1, len(kinds) + 1, len(dataset.roles.outputs)))
    for done in rolled_out(session, samples[dims.dp_rank :: dims.dp], steps):
        by_lead = baselines.forecasts(*done.sample)
        if fields is not None:
            by_lead = fields.with_maps(*done.sample, by_lead)
        for k, (forecast, truth) in enumerate(zip(done.forecasts, done.truths)):
            given = {MODEL: forecast, **by_lead[k]}
            for r, reference in enumerate(references):
                sums[k, r] += products([given[kind] for kind in kinds], truth, by_lead[k][reference], weights)
    for group in (dims.mp_group, dims.dp_group):
        if group is not None:
            sums = sum_over(sums, group)
    return [solve(sums[k], references, kinds) for k in range(steps)]
