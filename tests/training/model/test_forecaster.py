"""The forecaster: shapes and gradients on one rank; exact across ranks through the halos."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import ShardLayout, shard_sizes, sum_model_parallel_gradients
from processor.grids import get_grid
from training.model import Forecaster, ShardedGrids

NODE_PARAMETERS = (get_grid("o12").n_points, get_grid("o6").n_points, 4)
SPLIT_BY_POINTS = ("data_nodes.weight", "hidden_nodes.weight")


def _model(strategy: str, mapper: str = "graph_transformer", dtype: torch.dtype = torch.float32) -> Forecaster:
    torch.manual_seed(0)
    processor = TransformerProcessor(ProcessorConfig(2, 16, 4, window_size=30, strategy=strategy, num_chunks=0))
    model = Forecaster(3, 16, processor, mapper, mapper_heads=2, node_parameters=NODE_PARAMETERS).to(dtype)
    with torch.no_grad():  # as if trained: zeros (their start) would not show a wrong row
        for nodes in (model.data_nodes, model.hidden_nodes):
            nodes.weight.normal_()
    return model


def _data(dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(1)
    n = get_grid("o12").n_points
    return torch.randn(2, n, 3, generator=g, dtype=dtype), torch.randn(2, n, 3, generator=g, dtype=dtype)


def _grids(ranks: int, rank: int, mapper: str = "graph_transformer", dtype: torch.dtype = torch.float32):
    data, hidden = get_grid("o12"), get_grid("o6")
    grids = ShardedGrids.build(data.latitudes, data.longitudes, hidden, ranks, rank, 4, 3, mapper)
    return dataclasses.replace(
        grids,
        encoder=dataclasses.replace(grids.encoder, edge_attr=grids.encoder.edge_attr.to(dtype)),
        decoder=dataclasses.replace(grids.decoder, edge_attr=grids.decoder.edge_attr.to(dtype)),
        data_features=grids.data_features.to(dtype),
        hidden_features=grids.hidden_features.to(dtype),
    )


def _loss_and_grads(model, x, y, grids, group):
    x = x.clone().requires_grad_()
    pred = model(x, grids, group)
    loss = (pred - y).pow(2).sum()
    loss.backward()
    return pred.detach(), x.grad


@pytest.mark.parametrize("mapper", ["graph_transformer", "mean_mlp"])
def test_shapes_and_gradients_reach_every_parameter(mapper):
    model = _model("none", mapper)
    x, y = _data()
    pred, dx = _loss_and_grads(model, x, y, _grids(1, 0, mapper), None)
    assert pred.shape == x.shape and torch.isfinite(pred).all()
    assert dx.abs().sum() > 0
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == [], missing


def forecaster_case(group, strategy: str, mapper: str, dtype: torch.dtype) -> dict:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model(strategy, mapper, dtype)
    x, y = _data(dtype)
    layout = ShardLayout(tuple(shard_sizes(x.shape[1], ranks)), rank)
    rows = slice(layout.start, layout.stop)
    grids = _grids(ranks, rank, mapper, dtype)
    model.processor.split_parameters(group)
    model.split_node_parameters(grids)
    pred, dx = _loss_and_grads(model, x[:, rows], y[:, rows], grids, model.processor.build_groups(group))
    sum_model_parallel_gradients(model.parameters(), group)
    grads = {n: p.grad for n, p in model.named_parameters() if not n.startswith("processor.")}
    split = model.processor.strategy.splits_parameters  # shard_channels: this rank's share only
    return {
        "pred": pred.numpy(),
        "dx": dx.numpy(),
        "halos": (grids.encoder.halo, grids.decoder.halo),
        "grads": {n: g.numpy() for n, g in grads.items()},
        "processor_grads": {} if split else {n: p.grad.numpy() for n, p in model.processor.named_parameters()},
    }


CASES = [
    ("shard_sequence", 3, "graph_transformer", torch.float32),
    ("shard_heads", 2, "graph_transformer", torch.float32),
    ("shard_channels", 3, "graph_transformer", torch.float32),
    ("shard_sequence", 4, "mean_mlp", torch.float32),
    ("shard_sequence", 4, "graph_transformer", torch.float64),
    ("shard_heads", 3, "graph_transformer", torch.float64),
]


@pytest.mark.parametrize("strategy,ranks,mapper,dtype", CASES)
def test_sharded_forecaster_matches_one_rank(rank_pool, strategy, ranks, mapper, dtype):
    parts = rank_pool.run_ok(forecaster_case, ranks, strategy, mapper, dtype)
    model = _model("none", mapper, dtype)
    x, y = _data(dtype)
    pred, dx = _loss_and_grads(model, x, y, _grids(1, 0, mapper, dtype), None)
    assert any(h > 0 for p in parts for h in p["halos"])  # the halos are really used
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for got, want in (
        (np.concatenate([p["pred"] for p in parts], 1), pred),
        (np.concatenate([p["dx"] for p in parts], 1), dx),
    ):
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=tol * float(want.abs().max()))
    scale = max(float(p.grad.abs().max()) for p in model.parameters())
    for name, p in model.named_parameters():
        if name.startswith("processor."):
            if parts[0]["processor_grads"]:
                got = parts[0]["processor_grads"][name.removeprefix("processor.")]
                np.testing.assert_allclose(got, p.grad.numpy(), rtol=0, atol=tol * scale, err_msg=name)
            continue
        got = np.concatenate([q["grads"][name] for q in parts]) if name in SPLIT_BY_POINTS else parts[0]["grads"][name]
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=0, atol=tol * scale, err_msg=name)


def test_graphs_built_for_another_mapper_are_refused_in_one_line():
    model = _model("none", "graph_transformer")
    x, _ = _data()
    with pytest.raises(ValueError, match=r"mapper 'mean_mlp'.*build them with ShardedGrids.build"):
        model(x, _grids(1, 0, "mean_mlp"), None)
