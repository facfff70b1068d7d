"""The forecaster's linear baseline (model.baseline=linear_regression): the map per point worked
by hand; a network that has learned nothing forecasts the regression; and sharded over ranks the
run gives one rank's losses and parameters (each rank fits its own points)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.grids import get_grid
from tests.training.conftest import small_config
from tests.training.model.test_forecaster import _grids
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.model import Forecaster
from training.model.linear_baseline import LinearBaseline

# normalise_increments: the network learns in units of what the regression leaves, its
# statistics summed over the ranks (training.model.linear_baseline.residual_statistics)
BASELINE = (
    "model.baseline=linear_regression",
    "model.multistep_input=2",
    "trainer.steps=4",
    "model.normalise_increments=true",
)


def test_the_map_per_point_by_hand():
    """Point 0: y = 2 a - b + 1; point 1: y = 3 b (inputs a, b; the last row the constant)."""
    coef = torch.tensor([[[2.0], [-1.0], [1.0]], [[0.0], [3.0], [0.0]]])
    x = torch.tensor([[[1.0, 2.0], [5.0, -1.0]]])  # (b, points, inputs)
    torch.testing.assert_close(LinearBaseline(coef)(x), torch.tensor([[[1.0], [-3.0]]]))
    assert LinearBaseline(coef).state_dict() == {}  # never saved: fitted again from the store


def test_the_network_is_given_the_baselines_forecast():
    """With the embedding's weights on the baseline's columns, and no others, the network sees
    the regression's forecast and nothing else: its output moves with the regression."""
    torch.manual_seed(0)
    processor = TransformerProcessor(ProcessorConfig(2, 16, 4, window_size=30, num_chunks=0))
    model = Forecaster(3, 16, processor, mapper_heads=2, baseline_inputs=True).eval()
    n, grids = get_grid("o12").n_points, _grids(1, 0)
    x = torch.randn(1, n, 3)
    with pytest.raises(RuntimeError, match="set_linear_baseline"):
        model(x, grids, None)
    assert model.data_embed.in_features == 3 + 3 + 4  # the state, the baseline's forecast, coordinates
    with torch.no_grad():
        model.data_embed.weight[:, :3] = 0  # blind to the state itself
    outputs = []
    for scale in (1.0, 2.0):
        coef = torch.zeros(n, 4, 3)
        coef[:, :3] = scale * torch.eye(3)  # the regression: scale x the state
        model.set_linear_baseline(LinearBaseline(coef))
        with torch.no_grad():
            outputs.append(model(x, grids, None) - scale * x)  # what the network adds
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-4)


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
