"""A profiler trace reads as the strategy does: each strategy's phases are named ranges."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor

PHASES = {
    "shard_sequence": ["attention", "mlp"],
    "shard_heads": ["points_to_heads", "attend_my_heads", "heads_to_points", "mlp"],
    "shard_channels": ["attention", "mlp"],
    "shard_hybrid": ["points_to_heads", "across_head_groups", "heads_to_points"],
}


def _profiled_ranges(group, strategy: str) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    config = ProcessorConfig(num_layers=2, num_channels=16, num_heads=4, window_size=3, strategy=strategy)
    model = TransformerProcessor(config)
    model.split_parameters(group)
    mesh = model.build_groups(group)
    x = torch.randn(1, 9, 16, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x, group=mesh).sum().backward()
    return {e.name for e in prof.events() if e.name.startswith("gridshard/")}


@pytest.mark.parametrize("strategy", sorted(PHASES))
def test_each_phase_is_a_named_range(rank_pool, strategy) -> None:
    for names in rank_pool.run_ok(_profiled_ranges, 4, strategy):
        assert {f"gridshard/{strategy}/{phase}" for phase in PHASES[strategy]} <= names, sorted(names)
        if strategy == "shard_sequence":  # the halo's overlap: interior queries while it travels
            assert {"gridshard/halo_attention/interior", "gridshard/halo_attention/edges"} <= names
