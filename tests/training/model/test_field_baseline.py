"""The forecaster's field baseline (model.baseline=field_regression): what the per-point baseline
leaves, forecast from a neighbour's input, which no per-point map can; the map equal to the dual
fit it is converted from; never saved; and refused where the points are split over ranks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.training.conftest import small_config
from training.config.checks import check_config
from training.config.schema import run_config
from training.config.settings import ConfigValueError
from training.model.dual_ridge import DualFit
from training.model.field_baseline import fit_field_baseline
from training.model.linear_baseline import LinearBaseline


class ShiftedBatches:
    """What the fit reads of a store (``batches(samples, steps)`` -> inputs, targets): 4 points of
    2 inputs each; each point's next value is its western neighbour's first input."""

    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(n, 4, 2)).astype(np.float32)
        self.targets = np.roll(self.x[:, :, :1], 1, axis=1)[None]  # (steps, n, points, outputs)

    def __call__(self, samples: list, steps: int) -> SimpleNamespace:
        index = [t for t, _ in samples]
        return SimpleNamespace(x=torch.from_numpy(self.x[index]), targets=torch.from_numpy(self.targets[:, index]))


def test_the_field_map_forecasts_a_neighbours_value():
    batches = ShiftedBatches(300, seed=0)
    per_point = LinearBaseline(torch.zeros(4, 3, 1))  # learnt nothing: all is left to the field map
    baseline = fit_field_baseline(batches, [(t, 0) for t in range(300)], per_point)
    new = ShiftedBatches(20, seed=1)
    forecast = baseline(torch.from_numpy(new.x))
    np.testing.assert_allclose(forecast.numpy(), new.targets[0], atol=0.05)
    assert baseline.state_dict() == {}  # never saved: fitted again from the store


def test_the_map_is_the_dual_fit_it_came_from():
    """``x_new (X' coef)`` with ``X`` the standardised training inputs: the dual's ``k @ coef``."""
    batches = ShiftedBatches(200, seed=2)
    per_point = LinearBaseline(torch.zeros(4, 3, 1))
    baseline = fit_field_baseline(batches, [(t, 0) for t in range(200)], per_point)
    x = batches.x.reshape(200, -1).astype(np.float64)
    standard = (x - x.mean(0)) / x.std(0)
    new = ShiftedBatches(5, seed=3).x
    new_standard = (new.reshape(5, -1) - x.mean(0)) / x.std(0)
    penalty = 1e-3 * float(np.trace(standard @ standard.T) / 200)  # on noiseless targets: the smallest
    dual = DualFit.fit(standard @ standard.T, batches.targets[0].reshape(200, -1), penalty)
    expected = dual.predict(new_standard @ standard.T).reshape(5, 4, 1)
    np.testing.assert_allclose(baseline(torch.from_numpy(new)).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_points_split_over_ranks_are_refused(tmp_path, small_dataset):
    cfg = run_config(small_config(tmp_path, small_dataset, "model.baseline=field_regression"))
    with pytest.raises(ConfigValueError, match="model.baseline = field_regression reads every point on one rank"):
        check_config(cfg, world_size=2)
