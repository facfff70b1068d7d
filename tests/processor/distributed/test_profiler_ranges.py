"""Every collective shows in a profiler trace under its ``gridshard/...`` range."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import shard_sizes, sum_model_parallel_gradients
from processor.strategies import ShardSequence


def profiled_step(group, strategy: str) -> list[str]:
    """The ``gridshard/`` ranges of one profiled forward+backward and gradient sum on this rank."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(0)
    chosen = ShardSequence(ring=True) if strategy == "ring" else strategy
    model = TransformerProcessor(ProcessorConfig(1, 16, 4, window_size=4, num_chunks=0, strategy=chosen))
    model.split_parameters(group)
    x = torch.randn(1, shard_sizes(24, ranks)[rank], 16, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x, group=group).square().sum().backward()
        sum_model_parallel_gradients(model.parameters(), group)
    return sorted({e.name for e in prof.events() if e.name.startswith("gridshard/")})


AGREE = ["gridshard/agree_on_layout", "gridshard/all_reduce_gradients"]
HALO = ["gridshard/halo_exchange/" + phase for phase in ("grad_post", "grad_wait", "post", "wait")]


@pytest.mark.parametrize(
    "strategy,expected",
    [
        ("shard_sequence", AGREE + HALO),
        ("ring", AGREE + ["gridshard/ring/" + phase for phase in ("grad_post", "grad_wait", "post", "wait")]),
        ("shard_heads", ["gridshard/agree_on_layout", "gridshard/all_reduce_gradients", "gridshard/all_to_all"]),
        ("shard_channels", ["gridshard/agree_on_layout", "gridshard/all_gather", "gridshard/reduce_scatter"]),
    ],
)
def test_a_trace_names_every_collective(rank_pool, strategy, expected):
    for names in rank_pool.run_ok(profiled_step, 2, strategy):
        assert set(expected) <= set(names), names
