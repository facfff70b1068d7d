"""The per-lead calibration of the model's forecast: weights worked by hand on a small case, the
reference climatology it chooses, and the samples it is fitted on."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.skill.one_rank import one_rank_session
from training.model import field_forecast
from training.skill import calibration
from training.skill.baselines import fit_samples, training_baselines
from training.skill.calibration import (
    MODEL,
    LeadCalibration,
    blend_weights,
    calibration_count,
    describe,
    products,
    solve,
)
from training.skill.field_leads import FIELD_MAP, fit_field_leads
from training.skill.fitted import DAMPED_PERSISTENCE

KINDS = (MODEL, DAMPED_PERSISTENCE)


def _case(rng: np.random.Generator, points: int = 40, variables: int = 2):
    """Forecasts ``(points, variables)``: model, damped persistence, two climatologies, and a truth
    that is exactly ``c + 0.5 (model - c) + 0.3 (damped - c)`` about the second climatology."""
    model, damped = rng.normal(size=(2, points, variables))
    plain, hourly = rng.normal(size=(2, points, variables)) * [[0.1]]
    truth = hourly + 0.5 * (model - hourly) + 0.3 * (damped - hourly)
    return model, damped, {"climatology": plain, "hourly_climatology": hourly}, truth


def test_weights_and_reference_recovered_by_hand():
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.5, 1.5, size=40)
    sums = np.zeros((2, 3, 3, 2))
    for _ in range(5):  # five samples
        model, damped, climatologies, truth = _case(rng)
        for r, c in enumerate(climatologies.values()):
            sums[r] += products([model, damped], truth, c, weights)
    cal = solve(sums, ("climatology", "hourly_climatology"), KINDS)
    assert cal.references == ("hourly_climatology", "hourly_climatology")
    np.testing.assert_allclose(cal.weights, [[0.5, 0.3], [0.5, 0.3]], rtol=1e-10)
    model, damped, climatologies, truth = _case(rng)
    calibrated = cal.apply(model, {**climatologies, DAMPED_PERSISTENCE: damped})
    np.testing.assert_allclose(calibrated, truth, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "cross, expected",
    [
        ([0.5, 0.3], [0.5, 0.3]),  # inside the blends: least squares itself
        ([1.2, -0.2], [1.0, 0.0]),  # the model's anomaly over 1, damped persistence's below 0: the nearest blend
        ([0.9, 0.6], [0.65, 0.35]),  # the sum past 1: onto a + b = 1
        ([-0.3, -0.1], [0.0, 0.0]),  # both anti-correlated with the truth: the climatology alone
        ([-0.2, 0.4], [0.0, 0.4]),
    ],
)
def test_blend_weights_by_hand(cross, expected):
    """With orthonormal anomalies (``gram`` the identity) the squared error is the distance to the
    least-squares weights ``cross``, so the blend is their nearest point with every weight >= 0
    and their sum <= 1."""
    np.testing.assert_allclose(blend_weights(np.eye(2), np.array(cross)), expected, atol=1e-12)
    scale = 400.0**2 * 35 * 128  # sea-level pressure in Pa over a store's points and samples
    np.testing.assert_allclose(blend_weights(scale * np.eye(2), scale * np.array(cross)), expected, atol=1e-9)


@pytest.mark.parametrize(
    "anomalies, truth, expected",
    [
        ([[1.0, 1.0], [2.0, 2.0]], [0.5, 1.0], [0.5, 0.0]),  # the same forecast twice: the first face holding it
        ([[1.0, 0.0], [0.0, 0.0]], [0.4, 3.0], [0.4, 0.0]),  # a forecast with no anomaly weighs nothing
        ([[1e-3, 0.0], [0.0, 1e-3]], [20.0, 0.0], [1.0, 0.0]),  # a truth 1e4 times the forecast: its sum on the bound
    ],
)
def test_blend_weights_of_degenerate_forecasts(anomalies, truth, expected):
    """Rank-deficient products and a truth far larger than the forecasts (``anomalies``: points x
    forecasts)."""
    a, y = np.array(anomalies), np.array(truth)
    np.testing.assert_allclose(blend_weights(a.T @ a, a.T @ y), expected, atol=1e-9)


def test_blend_weights_are_the_least_error_blend():
    rng = np.random.default_rng(1)
    for _ in range(50):
        anomalies = rng.normal(size=(30, 3))
        truth = anomalies @ rng.normal(size=3) + rng.normal(size=30)
        gram, cross = anomalies.T @ anomalies, anomalies.T @ truth
        w = blend_weights(gram, cross)
        assert (w >= 0).all() and w.sum() <= 1 + 1e-12
        blends = rng.dirichlet(np.ones(4), size=2000)[:, :3]  # weights >= 0 summing to <= 1
        errors = np.einsum("bi,ij,bj->b", blends, gram, blends) - 2 * blends @ cross
        assert w @ gram @ w - 2 * w @ cross <= errors.min() + 1e-9


def test_products_are_the_weighted_sums():
    m, d, y, c = (np.array([[2.0], [1.0]]), np.array([[0.0], [3.0]]), np.array([[1.0], [1.0]]), np.ones((2, 1)))
    w = np.array([1.0, 2.0])
    # anomalies: m - c = (1, 0), d - c = (-1, 2), y - c = (0, 0)
    np.testing.assert_allclose(products([m, d], y, c, w)[..., 0], [[1.0, -1.0, 0.0], [-1.0, 9.0, 0.0], [0.0, 0.0, 0.0]])
    y[1, 0] = np.nan  # a missing value: that point counts nowhere
    np.testing.assert_allclose(products([m, d], y, c, w)[..., 0], [[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_the_model_alone_is_weighted_by_hand():
    sums = np.zeros((1, 2, 2, 1))
    sums[0, 0, 0, 0], sums[0, 0, 1, 0] = 4.0, 2.0  # sum m^2 = 4, sum m y = 2: a = 0.5
    cal = solve(sums, ("climatology",), (MODEL,))
    assert cal.weights[0, 0] == pytest.approx(0.5)
    out = cal.apply(np.array([[3.0]]), {"climatology": np.array([[1.0]])})
    assert out[0, 0] == pytest.approx(1.0 + 0.5 * 2.0)


def test_describe_names_each_lead():
    cal = LeadCalibration(KINDS, ("doy_climatology",), np.array([[0.9, 0.1]]))
    assert describe([cal, cal], ["t2m"], [6.0, 12.0]).splitlines() == [
        "calibration at 6 h: t2m model=0.90 damped_persistence=0.10 about doy_climatology",
        "calibration at 12 h: t2m model=0.90 damped_persistence=0.10 about doy_climatology",
    ]


def test_fitted_on_training_samples_the_baselines_read(tmp_path, small_dataset, monkeypatch):
    session = one_rank_session(tmp_path, small_dataset)
    monkeypatch.setattr(calibration, "CALIBRATION_SAMPLES", 5)
    chosen, fitted_on = calibration.calibration_samples(session, 2), fit_samples(session, 2)
    assert len(chosen) == 5 < len(fitted_on) and set(chosen) <= set(fitted_on)
    assert chosen == [fitted_on[i] for i in np.linspace(0, len(fitted_on) - 1, 5).round().astype(int)]


def test_a_large_grid_rolls_out_fewer_samples_and_never_below_the_minimum():
    """512 on every store of up to 8,192 points, then 2^22 samples x points, 128 at least."""
    assert [calibration_count(n) for n in (11, 1_617, 8_192)] == [512, 512, 512]
    assert [calibration_count(n) for n in (16_384, 64_800, 542_080)] == [256, 128, 128]


def test_a_calibration_period_is_what_the_calibration_reads_and_weighs_the_field_map(
    tmp_path, small_dataset, monkeypatch
):
    """With ``data.calibration_fraction`` the calibration rolls out the held-out period's samples
    (none a training or validation date) and weighs the field map of each lead beside the model."""
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", 8)  # the small store's samples fit
    session = one_rank_session(tmp_path, small_dataset, "data.calibration_fraction=0.25")
    chosen, lead = calibration.calibration_samples(session, 2), session.samples.lead
    train, val = [t for t, _ in session.samples.train], [t for t, _ in session.samples.val]
    assert chosen and all(max(train) + lead < t and t + 2 * lead < min(val) for t, _ in chosen)
    baselines = training_baselines(session, 2, [t + k * lead for t, _ in chosen for k in range(3)])
    fits = calibration.fit_calibration(session, baselines, fit_field_leads(session, baselines))
    assert fits is not None and all(fit.kinds == (MODEL, DAMPED_PERSISTENCE, FIELD_MAP) for fit in fits)
    assert all(np.isfinite(fit.weights).all() and (fit.weights >= 0).all() for fit in fits)


def test_a_period_shorter_than_the_leads_calibrates_on_training_dates(tmp_path, small_dataset, monkeypatch):
    """A period of 4 dates holds no sample with 4 leads: the training samples, no field map."""
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", 8)
    session = one_rank_session(tmp_path, small_dataset, "data.calibration_fraction=0.1")
    assert session.samples.calibration  # one-step samples there are
    chosen = calibration.calibration_samples(session, 4)
    assert set(chosen) <= set(fit_samples(session, 4))
    assert fit_field_leads(session, training_baselines(session, 4, [])) is None
