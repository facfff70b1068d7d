"""The two fitted baselines, worked by hand: the ridge regression per point (its penalty, the
unpenalised constant) and the lag correlation per point (clipped to [0, 1]), and the forecasts
they make. Scored in a training run, sharded and not: tests/training/data/test_batches.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.skill.test_baselines import TWO_DAYS, _session
from training.model import ridge
from training.model.ridge import RidgeFit, regression_groups
from training.skill.climatologies import training_climatologies
from training.skill.fitted import (
    DAMPED_PERSISTENCE,
    LINEAR_REGRESSION,
    FittedBaselines,
    LagCorrelation,
    fit_baselines,
)


def test_ridge_fit_by_hand():
    """One point, feature x = (1, -1), target y = (5, 1): X'X = diag(2, 2), X'y = (4, 6). With
    ridge 0.5 per sample the feature's penalty is 0.5 x 2 = 1: coef 4 / 3, the constant 6 / 2."""
    fit = RidgeFit(points=1, features=1, outputs=1)
    fit.add(np.array([[[1.0]], [[-1.0]]]), np.array([[[5.0]], [[1.0]]]))
    fit.solve(ridge=0.5)
    np.testing.assert_allclose(fit.coef[0, :, 0].numpy(), [4 / 3, 3.0], rtol=1e-8)
    np.testing.assert_allclose(fit.predict(np.array([[3.0]])), [[4.0 + 3.0]], rtol=1e-8)


def test_ridge_fit_is_per_point_and_exact_without_penalty():
    """Two points with their own lines, y = 2x + 3 and y = -x: recovered exactly, each alone."""
    x = np.array([[[0.0], [1.0]], [[1.0], [2.0]], [[2.0], [-1.0]]])  # (samples, points, features)
    y = np.stack([2 * x[:, 0] + 3, -x[:, 1]], axis=1)
    fit = RidgeFit(points=2, features=1, outputs=1)
    fit.add(x[:2], y[:2])
    fit.add(x[2:], y[2:])  # in two parts: the sums add
    fit.solve(ridge=0.0)
    np.testing.assert_allclose(fit.predict(np.array([[10.0], [10.0]])), [[23.0], [-10.0]], atol=1e-6)


def test_lag_correlation_by_hand():
    """Point 0: anomalies (1, 2) then (2, 1): 4 / sqrt(5 x 5) = 0.8. Point 1: opposite signs,
    clipped to 0. Point 2: no anomaly at all, 0."""
    lag = LagCorrelation(points=3, outputs=1)
    lag.add(np.array([[1.0], [1.0], [0.0]]), np.array([[2.0], [-1.0], [0.0]]))
    lag.add(np.array([[2.0], [2.0], [0.0]]), np.array([[1.0], [-3.0], [0.0]]))
    np.testing.assert_allclose(lag.rho(), [[0.8], [0.0], [0.0]])


def test_fitted_forecasts_by_hand():
    fit = RidgeFit(points=1, features=1, outputs=1)
    fit.add(np.array([[[1.0]], [[-1.0]]]), np.array([[[5.0]], [[1.0]]]))
    fit.solve(ridge=0.0)  # y = 2x + 3
    fitted = FittedBaselines([fit], [np.array([[0.25]])])
    out = fitted.forecasts(0, np.array([[1.5]]), np.array([[4.0]]), np.array([[10.0]]), lambda y: 100 * y)
    np.testing.assert_allclose(out[DAMPED_PERSISTENCE], [[10.0 + 0.25 * 4.0]])
    np.testing.assert_allclose(out[LINEAR_REGRESSION], [[100 * (2 * 1.5 + 3)]])
    assert FittedBaselines(None, [np.zeros((1, 1))]).kinds == (DAMPED_PERSISTENCE,)


def test_a_solved_fit_keeps_its_coefficients_alone():
    fit = RidgeFit(points=1, features=1, outputs=1)
    fit.add(np.array([[[1.0]], [[-1.0]]]), np.array([[[5.0]], [[1.0]]]))
    fit.solve()
    assert fit.gram is None and fit.cross is None
    with pytest.raises(RuntimeError, match="after solve"):
        fit.add(np.array([[[1.0]]]), np.array([[[5.0]]]))


def test_the_regressions_are_fitted_in_groups_whose_sums_fit(monkeypatch):
    assert regression_groups(points=4, features=3, outputs=2, leads=5) == [[(k, 0, 4) for k in range(5)]]
    one_lead = 4 * (3 + 1) * (3 + 1 + 2) * 8  # points x (features + 1) x (features + 1 + outputs) float64s
    monkeypatch.setattr(ridge, "MAX_NORMAL_EQUATIONS_BYTES", 2 * one_lead + 1)
    two_leads = regression_groups(points=4, features=3, outputs=2, leads=5)
    assert two_leads == [[(0, 0, 4), (1, 0, 4)], [(2, 0, 4), (3, 0, 4)], [(4, 0, 4)]]
    monkeypatch.setattr(ridge, "MAX_NORMAL_EQUATIONS_BYTES", one_lead - 1)  # 3 points' sums fit
    blocks = regression_groups(points=4, features=3, outputs=2, leads=2)
    assert blocks == [[(0, 0, 3)], [(0, 3, 4), (1, 0, 2)], [(1, 2, 4)]]  # (lead, first point, stop)


@pytest.mark.parametrize("points_a_pass", [2, 1], ids=["a lead a pass", "a point a pass"])
def test_a_fit_in_passes_is_the_fit_in_one_pass(monkeypatch, points_a_pass):
    """Three leads' regressions and lag correlations on a tiny store: fitted together, or a lead
    (or a point of a lead) a pass over the training samples, as on a grid whose sums do not fit
    at once, the same."""
    session = _session(TWO_DAYS, [0, 1, 2])
    starts, steps = session.samples.train, 3
    climatologies = training_climatologies(session, list(range(6)))
    together = fit_baselines(session, steps, climatologies, starts)
    one_point = (1 + 1) * (1 + 1 + 1) * 8  # 1 feature, 1 output
    monkeypatch.setattr(ridge, "MAX_NORMAL_EQUATIONS_BYTES", points_a_pass * one_point)
    apart = fit_baselines(session, steps, climatologies, starts)
    assert together.regressions is not None and apart.regressions is not None
    for k in range(steps):
        np.testing.assert_array_equal(apart.regressions[k].coef.numpy(), together.regressions[k].coef.numpy())
        np.testing.assert_array_equal(apart.damping[k], together.damping[k])
    assert len({float(together.regressions[k].coef[0, 0, 0]) for k in range(steps)}) == steps  # a fit a lead
