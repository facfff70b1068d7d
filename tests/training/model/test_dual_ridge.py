"""Ridge regressions in the dual (training/model/dual_ridge.py), against the primal ridge worked
in numpy; the kernel; each variable's penalty chosen on held-out training samples."""

from __future__ import annotations

import numpy as np
import pytest

from training.model.dual_ridge import (
    KERNEL_GAMMAS,
    LINEAR,
    DualFit,
    HeldOutSpectrum,
    choose_and_fit,
    field_kernels,
    held_out_cut,
    rbf,
    squared_distances,
)


def test_the_dual_fit_is_the_ridge_regression():
    """With the linear kernel ``X X'``, the dual fit forecasts ``x (X'X + l I)^-1 X'(y - mean) + mean``."""
    rng = np.random.default_rng(0)
    x, y, new = rng.normal(size=(30, 4)), rng.normal(size=(30, 2)), rng.normal(size=(5, 4))
    penalty = 0.7
    primal = new @ np.linalg.solve(x.T @ x + penalty * np.eye(4), x.T @ (y - y.mean(0))) + y.mean(0)
    fit = DualFit.fit(x @ x.T, y, penalty)
    np.testing.assert_allclose(fit.predict(new @ x.T), primal, rtol=1e-10)


@pytest.mark.parametrize("kind", ["linear", "gaussian"])
def test_one_eigendecomposition_forecasts_the_held_out_samples_as_a_solve_per_penalty(kind):
    """The held-out forecasts for each penalty, from one eigendecomposition of the fitted samples'
    kernel, are the :class:`DualFit`'s on those samples (a solve per penalty)."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(60, 8)), rng.normal(size=(60, 3))
    gram = x @ x.T
    kernel = gram if kind == "linear" else rbf(squared_distances(gram, (x * x).sum(1), (x * x).sum(1)), 0.05)
    penalties, cut = (1e-3, 0.1, 10.0), 50
    forecasts = list(HeldOutSpectrum.of(kernel, cut).forecasts(y, penalties))
    assert len(forecasts) == len(penalties)
    for penalty, held_out in zip(penalties, forecasts):
        solved = DualFit.fit(kernel[:cut, :cut], y[:cut], penalty).predict(kernel[cut:, :cut])
        np.testing.assert_allclose(held_out, solved, rtol=1e-8, atol=1e-10)


def test_squared_distances_and_the_gaussian_kernel():
    a, b = np.array([[0.0, 0.0], [1.0, 2.0]]), np.array([[3.0, 4.0]])
    d = squared_distances(a @ b.T, (a * a).sum(1), (b * b).sum(1))
    np.testing.assert_allclose(d, [[25.0], [8.0]])
    np.testing.assert_allclose(rbf(d, 0.1), np.exp([[-2.5], [-0.8]]))


def test_each_variable_takes_the_penalty_its_held_out_samples_choose():
    """Two variables at two points (columns point-major): a line takes a small penalty; pure noise
    the largest (its mean); each refitted on every sample."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    line, noise = x @ [1.0, 2.0, -1.0], rng.normal(size=200)
    targets = np.stack([line, noise, 2 * line, noise[::-1]], axis=1)
    penalties = (1e-6, 1e-2, 1e2, 1e6)
    fit = choose_and_fit({"linear": x @ x.T}, targets, penalties, np.array([0, 1, 0, 1]))
    line_choice, noise_choice = fit.choices
    assert line_choice.key == "linear" and line_choice.penalty < 1 and noise_choice.penalty == 1e6
    for columns, choice in (([0, 2], line_choice), ([1, 3], noise_choice)):
        expected = DualFit.fit(x @ x.T, targets[:, columns], choice.penalty).predict(x[:5] @ x.T)
        np.testing.assert_allclose(fit.predict({"linear": x[:5] @ x.T})[:, columns], expected)


def test_the_latest_samples_choose_and_the_weights_weigh():
    """Targets that follow x for the first 90 samples and -x for the last 10: fitted on the first,
    the held-out latest ones choose the largest penalty (the least wrong). A column of zero
    weight does not take part in the choice."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(100, 1))
    flips = np.where(np.arange(100) < 90, 1.0, -1.0)[:, None] * x
    targets = np.concatenate([flips, x], axis=1)  # one variable: the flipped column, then a plain one
    penalties = (1e-6, 1e6)
    chosen = choose_and_fit({"linear": x @ x.T}, targets, penalties, np.array([0, 0]), np.array([1.0, 0.0]))
    assert chosen.choices[0].penalty == 1e6
    plain = choose_and_fit({"linear": x @ x.T}, targets, penalties, np.array([0, 0]), np.array([0.0, 1.0]))
    assert plain.choices[0].penalty == 1e-6


def test_a_spectrum_of_other_samples_is_refused():
    x = np.random.default_rng(5).normal(size=(40, 3))
    spectra = {LINEAR: HeldOutSpectrum.of(x[:30] @ x[:30].T, held_out_cut(30))}
    with pytest.raises(ValueError, match="a spectrum of 27 \\+ 3 samples for 40 targets"):
        choose_and_fit({LINEAR: x @ x.T}, x, (1.0,), np.zeros(3, dtype=int), spectra=spectra)


def test_too_few_samples_to_hold_out_are_refused():
    with pytest.raises(ValueError, match="10 training samples: too few"):
        held_out_cut(10)
    assert held_out_cut(20) == 18


def test_the_kernels_offered_are_the_gram_matrix_and_gaussians_scaled_by_the_median_distance():
    """Three samples on a line at 0, 1 and 3: squared distances 1, 9 and 4, whose median is 4."""
    x = np.array([[0.0], [1.0], [3.0]])
    kernels = field_kernels(x @ x.T, (x * x).sum(1))
    assert list(kernels) == [LINEAR, *(g / 4 for g in KERNEL_GAMMAS)]
    np.testing.assert_allclose(kernels[LINEAR], x @ x.T)
    gamma = KERNEL_GAMMAS[0] / 4
    np.testing.assert_allclose(kernels[gamma], np.exp(-gamma * np.array([[0, 1, 9], [1, 0, 4], [9, 4, 0]])))


def test_a_curve_chooses_a_gaussian_kernel_which_the_linear_one_cannot_forecast():
    """Of the kernels offered, a target quadratic in the inputs takes a Gaussian; the Gaussian's
    held-out gain there is well past the linear kernel's, which cannot forecast a square."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 2))
    targets = (x[:, :1] ** 2) + 0.05 * rng.normal(size=(300, 1))
    kernels = field_kernels(x @ x.T, (x * x).sum(1))
    every = choose_and_fit(kernels, targets, (1e-3, 1e-2, 1e-1, 1.0), np.array([0]))
    linear = choose_and_fit({LINEAR: kernels[LINEAR]}, targets, (1e-3, 1e-2, 1e-1, 1.0), np.array([0]))
    assert every.choices[0].key != LINEAR
    assert every.choices[0].gain > 0.9 and linear.choices[0].gain < 0.2
