"""The per-point ridge regression (training/model/ridge.py): fitted a block of points at a time
where its sums would not fit at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import training.model.ridge as ridge
from training.model.ridge import RidgeFit, fit_in_point_blocks, sums_bytes


def _chunks(rng: np.random.Generator, points: int = 7, features: int = 3, outputs: int = 2) -> list:
    """Two chunks of (features (samples, points, features), targets (samples, points, outputs))."""
    out = []
    for samples in (5, 4):
        x = rng.normal(size=(samples, points, features))
        y = x @ rng.normal(size=(features, outputs)) + 0.1 * rng.normal(size=(samples, points, outputs))
        out.append((x, y))
    return out


def test_a_fit_a_block_of_points_a_pass_is_the_fit_in_one_pass(monkeypatch):
    chunks = _chunks(np.random.default_rng(0))
    passes = []

    def samples():
        passes.append(1)
        yield from chunks

    whole = fit_in_point_blocks(samples)
    assert len(passes) == 1 and whole.shape == (7, 4, 2) and whole.dtype == torch.float32
    one = RidgeFit(7, 3, 2)
    for x, y in chunks:
        one.add(x, y)
    one.solve()
    np.testing.assert_array_equal(whole.numpy(), one.coef.float().numpy())

    passes.clear()
    monkeypatch.setattr(ridge, "MAX_NORMAL_EQUATIONS_BYTES", 3 * sums_bytes(1, 3, 2))  # 3 points a block
    blocked = fit_in_point_blocks(samples)
    assert len(passes) == 3  # points 0-2, 3-5, 6
    np.testing.assert_array_equal(blocked.numpy(), whole.numpy())


def test_no_sample_is_a_clear_error():
    with pytest.raises(ValueError, match="no training sample"):
        fit_in_point_blocks(lambda: iter(()))
