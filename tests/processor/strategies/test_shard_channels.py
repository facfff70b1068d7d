"""shard_channels' parameter split: memory per rank, full state dicts, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import full_optimizer_state, load_full_optimizer_state


def _model(strategy: str = "shard_channels", heads: int = 4) -> TransformerProcessor:
    torch.manual_seed(0)
    config = ProcessorConfig(
        num_layers=2, num_channels=64, num_heads=heads, window_size=5, mlp_hidden_ratio=4, strategy=strategy
    )
    return TransformerProcessor(config)


def _state_bytes(optimiser: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in optimiser.state.values() for t in s.values() if t.dim() > 0)


def split_memory_and_round_trip(group) -> dict:
    import torch.distributed as dist

    model = _model()
    full = {k: v.clone() for k, v in model.state_dict().items()}
    model.split_parameters(group)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rank = dist.get_rank(group)
    x = torch.randn(1, 10 + rank, 64)
    model(x, group=group).square().sum().backward()
    optimiser.step()
    gathered = model.full_state_dict(group)
    opt_state = full_optimizer_state(optimiser, group)
    fresh = _model()
    fresh.split_parameters(group)
    fresh.load_full_state_dict(gathered)
    fresh_optimiser = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    load_full_optimizer_state(fresh_optimiser, opt_state, rank)
    same_shares = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    same_moments = all(
        torch.equal(optimiser.state[p]["exp_avg"], fresh_optimiser.state[q]["exp_avg"])
        for p, q in zip(model.parameters(), fresh.parameters())
    )
    return {
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "optimiser_bytes": _state_bytes(optimiser),
        "full_shapes_match": all(gathered[k].shape == v.shape for k, v in full.items()),
        "same_shares": same_shares,
        "same_moments": same_moments,
        "unchanged_weight": np.abs(
            gathered["blocks.0.attn.qkv.weight"].numpy() - full["blocks.0.attn.qkv.weight"].numpy()
        ).max(),
    }


def test_parameters_and_optimiser_state_are_split(rank_pool):
    """Per rank ~1/P of one rank's parameter and AdamW bytes (measured); full state dicts and
    optimiser states gather and load back exactly."""
    one = _model("none")
    one_opt = torch.optim.AdamW(one.parameters(), lr=1e-3)
    one(torch.randn(1, 40, 64)).square().sum().backward()
    one_opt.step()
    one_params = sum(p.numel() * p.element_size() for p in one.parameters())
    one_state = _state_bytes(one_opt)
    for ranks in (2, 4):
        parts = rank_pool.run_ok(split_memory_and_round_trip, ranks)
        for part in parts:
            assert part["full_shapes_match"] and part["same_shares"] and part["same_moments"]
            assert 0 < part["unchanged_weight"] < 1  # one AdamW step moved the weights, a little
            assert part["param_bytes"] / one_params <= 1 / ranks + 0.02
            assert part["optimiser_bytes"] / one_state <= 1 / ranks + 0.02


def forward_unsplit(group) -> None:
    _model()(torch.randn(1, 10, 64), group=group)


def test_an_unsplit_model_is_refused_on_every_rank(rank_pool):
    errors = rank_pool.run(forward_unsplit, 2)
    assert all("split_parameters" in getattr(e, "message", "") for e in errors), errors


def test_more_ranks_than_heads_is_a_config_error():
    with pytest.raises(ValueError, match="shard_channels.*num_heads >= ranks"):
        ProcessorConfig(num_layers=1, num_channels=6, num_heads=3, strategy="shard_channels").check_world_size(4)


def copy_after_split(group) -> dict:
    """A deep copy of a split model (its parameters new objects) trains like the original."""
    import copy

    import torch.distributed as dist

    from processor.distributed import sum_model_parallel_gradients

    model = _model()
    model.split_parameters(group)
    twin = copy.deepcopy(model)
    x = torch.randn(1, 10 + dist.get_rank(group), 64)
    out = {}
    for name, m in (("model", model), ("twin", twin)):
        y = m(x, group=group)
        y.square().sum().backward()
        sum_model_parallel_gradients(m.parameters(), group)
        out[name] = [p.grad.numpy() for p in m.parameters()]
    return out


def test_a_copy_of_a_split_model_keeps_its_split(rank_pool):
    for part in rank_pool.run_ok(copy_after_split, 2):
        for a, b in zip(part["model"], part["twin"]):
            np.testing.assert_array_equal(a, b)


def split_on_rank_zero_only(group) -> None:
    import torch.distributed as dist

    model = _model()
    if dist.get_rank(group) == 0:
        model.split_parameters(group)
    model(torch.randn(1, 10, 64), group=group)


def test_ranks_that_disagree_on_the_split_all_raise(rank_pool):
    errors = rank_pool.run(split_on_rank_zero_only, 2)
    assert all("parameters" in getattr(e, "message", "") for e in errors), errors
