"""The forecaster's linear baseline (model.baseline=linear_regression): the map per point worked
by hand; a network that has learned nothing forecasts the regression; and sharded over ranks the
run gives one rank's losses and parameters (each rank fits its own points)."""

from __future__ import annotations

import numpy as np
import torch

from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.model.linear_baseline import LinearBaseline

BASELINE = ("model.baseline=linear_regression", "model.multistep_input=2", "trainer.steps=4")


def test_the_map_per_point_by_hand():
    """Point 0: y = 2 a - b + 1; point 1: y = 3 b (inputs a, b; the last row the constant)."""
    coef = torch.tensor([[[2.0], [-1.0], [1.0]], [[0.0], [3.0], [0.0]]])
    x = torch.tensor([[[1.0, 2.0], [5.0, -1.0]]])  # (b, points, inputs)
    torch.testing.assert_close(LinearBaseline(coef)(x), torch.tensor([[[1.0], [-3.0]]]))
    assert LinearBaseline(coef).state_dict() == {}  # never saved: fitted again from the store


def test_sharded_runs_give_one_ranks_numbers(tmp_path, small_dataset):
    sharded = run(small_config(tmp_path / "sharded", small_dataset, *BASELINE, "trainer.nprocs=2"))
    single = run(small_config(tmp_path / "single", small_dataset, *BASELINE, "strategy=none", "trainer.nprocs=1"))
    losses = [np.array([m["train/loss"] for _, m in result["history"]]) for result in (sharded, single)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    saved, reference = (
        load_checkpoint(tmp_path / d / "checkpoints" / "latest.pt")["model"] for d in ("sharded", "single")
    )
    assert not any("linear_baseline" in name for name in reference)
    for name, value in reference.items():
        if not name.endswith(("k_norm.bias", "lin_key.bias")):  # round-off gradients, scaled up by Adam (test_app)
            torch.testing.assert_close(saved[name], value, rtol=1e-3, atol=1e-5, msg=name)
    plain = run(small_config(tmp_path / "plain", small_dataset, *BASELINE[1:], "strategy=none", "trainer.nprocs=1"))
    first = [result["history"][0][1]["train/loss"] for result in (single, plain)]
    assert first[0] < first[1]  # before any learning, the regression is a better step than persistence
