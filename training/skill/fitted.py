"""The baselines a statistician fits on the training dates, per point and lead:

- ``linear_regression``: ridge regression of each output at lead ``k`` on what the model is
  given at the same point: its input (the prognostic states, oldest first, and the forcings at
  the input date, all normalised, as :class:`training.data.batches.Batches` builds it), the
  forcings at the valid date, and a constant. WeatherBench 1's "LR" is this kind of baseline.
- ``damped_persistence``: the initial anomaly from the climatology, decayed toward it by the lag
  correlation of the anomalies ``k`` leads apart, fitted per point, output and lead (clipped to
  ``[0, 1]``): ``c(v) + rho_k (x0 - c(t))``, with the anomaly persistence's climatologies
  (:meth:`training.skill.climatologies.Climatologies.anomaly_reference`).

Both are fitted on the training samples :func:`training.skill.baselines.fit_samples` reads (every
one on a grid small enough, :func:`training.skill.climatologies.date_count`): no validation
date is seen. Each rank fits its own block of points (per point: no communication).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from training.data.batches import Batches
from training.data.samples import Sample
from training.model.linear_baseline import LINEAR_REGRESSION, training_chunks
from training.model.ridge import RegressionBlock, RidgeFit, regression_groups, sums_bytes
from training.session import Session
from training.skill.climatologies import Climatologies

DAMPED_PERSISTENCE = "damped_persistence"
FITTED = (LINEAR_REGRESSION, DAMPED_PERSISTENCE)

log = logging.getLogger(__name__)


class LagCorrelation:
    """The correlation of anomalies ``k`` leads apart, per point and output, from sums over
    samples of ``a0 ak``, ``a0²`` and ``ak²`` (uncentred: anomalies from a climatology)."""

    def __init__(self, points: int, outputs: int) -> None:
        self.sums = np.zeros((3, points, outputs))

    def add(self, initial: np.ndarray, valid: np.ndarray) -> None:
        """Add one sample's anomalies ``(points, outputs)`` at its initial and valid dates."""
        self.sums += np.stack([initial * valid, initial**2, valid**2])

    def rho(self) -> np.ndarray:
        """``(points, outputs)`` the lag correlation clipped to ``[0, 1]`` (0 where undefined)."""
        cross, initial, valid = self.sums
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = cross / np.sqrt(initial * valid)
        return np.clip(np.nan_to_num(rho, nan=0.0), 0.0, 1.0)


@dataclass
class FittedBaselines:
    """The two fitted baselines of one rank's points, one fit per lead (see the module)."""

    regressions: list[RidgeFit] | None  # None: no training sample to fit them on
    damping: list[np.ndarray]  # per lead: (local points, outputs) the lag correlation

    @property
    def kinds(self) -> tuple[str, ...]:
        return FITTED if self.regressions is not None else (DAMPED_PERSISTENCE,)

    def forecasts(
        self, lead: int, features: np.ndarray, anomaly: np.ndarray, at_valid: np.ndarray, denormalise
    ) -> dict[str, np.ndarray]:
        """Each fitted baseline's forecast ``(local points, outputs)`` in physical units at lead
        index ``lead``: ``features`` ``(local points, features)`` what the regression reads,
        ``anomaly`` the initial state's from the climatology, ``at_valid`` the climatology at the
        valid date; ``denormalise`` maps normalised outputs to physical units."""
        out = {DAMPED_PERSISTENCE: at_valid + self.damping[lead] * anomaly}
        if self.regressions is not None:
            out[LINEAR_REGRESSION] = denormalise(self.regressions[lead].predict(features))
        return out


Fits = dict[RegressionBlock, RidgeFit]  # the regressions of a pass, or of every pass


def fit_baselines(session: Session, steps: int, climatologies: Climatologies, starts: list[Sample]) -> FittedBaselines:
    """Fit both baselines for leads 1 to ``steps`` on ``session``'s points from the training
    samples ``starts`` (each with targets ``steps`` leads on), read a chunk at a time
    (:func:`training.model.linear_baseline.training_chunks`): the lag correlations and the first
    group of regressions (:func:`regression_groups`) in one pass, each further group in its own."""
    dataset, batches, lead = session.dataset, session.batches, session.samples.lead
    columns = dataset.roles.output_columns()
    correlations: list[LagCorrelation] = []
    groups: list[list[RegressionBlock]] = []
    fits: Fits = {}
    for chunk, x, targets in training_chunks(batches, starts, steps):
        valid_forcings = batches.valid_forcings(chunk, steps)
        if not correlations:
            points, outputs = targets.shape[2:]
            features = x.shape[-1] + valid_forcings.shape[-1]
            correlations = [LagCorrelation(points, outputs) for _ in range(steps)]
            groups = regression_groups(points, features, outputs, steps)
            if len(groups) > 1:
                need = sums_bytes(points, features, outputs) * steps / 2**30
                log.info("linear_regression: %.1f GiB of sums, fitted in %d passes over the dates", need, len(groups))
            fits = _new_fits(groups[0], features, outputs) if groups else {}
        _add_regressions(fits, x, valid_forcings, targets)
        initial = [dataset.denormalise(dataset.state(t, session.points, m))[:, columns] for t, m in chunk]
        for k in range(steps):
            truth = dataset.denormalise_outputs(targets[k])
            for i, (t, _) in enumerate(chunk):
                at_start, at_valid = climatologies.anomaly_reference(t, t + (k + 1) * lead)
                correlations[k].add(initial[i] - at_start, truth[i] - at_valid)
    for fit in fits.values():
        fit.solve()  # before the next group's sums are made
    for group in groups[1:]:
        fits |= _fit_regressions(batches, starts, steps, group, features, outputs)
    by_lead = [[fit for block, fit in fits.items() if block.lead == k] for k in range(steps)]  # in point order
    regressions = [RidgeFit.stacked(blocks) for blocks in by_lead] if fits else None
    return FittedBaselines(regressions, [c.rho() for c in correlations])


def _new_fits(group: list[RegressionBlock], features: int, outputs: int) -> Fits:
    """An empty fit for each regression of ``group``."""
    return {block: RidgeFit(block.stop - block.first, features, outputs) for block in group}


def _add_regressions(fits: Fits, x: np.ndarray, forcings: np.ndarray, targets: np.ndarray) -> None:
    """Add a chunk to each regression: the model's inputs ``x`` and the valid date's forcings
    ``forcings[k]`` against ``targets[k]`` at its lead ``k``, on its points."""
    for block, fit in fits.items():
        k, at = block.lead, block.point_slice
        fit.add(np.concatenate([x[:, at], forcings[k][:, at]], axis=-1), targets[k][:, at])


def _fit_regressions(
    batches: Batches, starts: list[Sample], steps: int, group: list[RegressionBlock], features: int, outputs: int
) -> Fits:
    """The solved regressions of ``group``, from one more pass over ``starts``."""
    fits = _new_fits(group, features, outputs)
    for chunk, x, targets in training_chunks(batches, starts, steps):
        _add_regressions(fits, x, batches.valid_forcings(chunk, steps), targets)
    for fit in fits.values():
        fit.solve()
    return fits
