"""The forecaster: shapes and gradients on one rank; exact across ranks through the halos."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import ShardLayout, shard_sizes, sum_model_parallel_gradients
from processor.grids import get_grid
from training.model import Forecaster, ShardedGrids


def _model(strategy: str) -> Forecaster:
    torch.manual_seed(0)
    return Forecaster(
        3, 16, TransformerProcessor(ProcessorConfig(2, 16, 4, window_size=30, strategy=strategy, num_chunks=0))
    )


def _data():
    g = torch.Generator().manual_seed(1)
    n = get_grid("o12").n_points
    return torch.randn(2, n, 3, generator=g), torch.randn(2, n, 3, generator=g)


def _grids(ranks: int, rank: int) -> ShardedGrids:
    data, hidden = get_grid("o12"), get_grid("o6")
    return ShardedGrids.build(data.latitudes, data.longitudes, hidden, ranks, rank, encoder_k=4, decoder_k=3)


def _loss_and_grads(model, x, y, grids, group):
    x = x.clone().requires_grad_()
    pred = model(x, grids, group)
    loss = (pred - y).pow(2).sum()
    loss.backward()
    return pred.detach(), x.grad


def test_shapes_and_gradients_reach_every_parameter():
    model = _model("none")
    x, y = _data()
    pred, dx = _loss_and_grads(model, x, y, _grids(1, 0), None)
    assert pred.shape == x.shape and torch.isfinite(pred).all()
    assert dx.abs().sum() > 0
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == [], missing


def forecaster_case(group, strategy: str) -> dict:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model(strategy)
    x, y = _data()
    layout = ShardLayout(tuple(shard_sizes(x.shape[1], ranks)), rank)
    rows = slice(layout.start, layout.stop)
    grids = _grids(ranks, rank)
    pred, dx = _loss_and_grads(model, x[:, rows], y[:, rows], grids, group)
    sum_model_parallel_gradients(model.parameters(), group)
    return {
        "pred": pred.numpy(),
        "dx": dx.numpy(),
        "halos": (grids.encoder.halo, grids.decoder.halo),
        "grads": {n: p.grad.numpy() for n, p in model.named_parameters()},
    }


@pytest.mark.parametrize("strategy,ranks", [("shard_sequence", 3), ("shard_heads", 2), ("shard_sequence", 4)])
def test_sharded_forecaster_matches_one_rank(rank_pool, strategy, ranks):
    parts = rank_pool.run_ok(forecaster_case, ranks, strategy)
    model = _model("none")
    x, y = _data()
    pred, dx = _loss_and_grads(model, x, y, _grids(1, 0), None)
    assert any(h > 0 for p in parts for h in p["halos"])  # the halos are really used
    for got, want in (
        (np.concatenate([p["pred"] for p in parts], 1), pred),
        (np.concatenate([p["dx"] for p in parts], 1), dx),
    ):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-5 * float(want.abs().max()))
    scale = max(float(p.grad.abs().max()) for p in model.parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(parts[0]["grads"][name], p.grad.numpy(), rtol=0, atol=1e-5 * scale, err_msg=name)
