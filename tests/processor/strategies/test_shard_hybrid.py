"""shard_hybrid's knob, its groups and its errors (exactness lives in test_exactness.py)."""

from __future__ import annotations

import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.config import ConfigError
from processor.strategies import ShardHybrid, StrategyOptionError, resolve_strategy


@pytest.mark.parametrize(
    "heads,ranks,expected",
    [(16, 8, 8), (16, 16, 8), (4, 6, 3), (2, 4, 2), (4, 5, 1), (3, 3, 3)],
)
def test_default_head_group_is_the_largest_divisor_within_heads_and_a_node(heads, ranks, expected) -> None:
    assert ShardHybrid().group_size(heads, ranks) == expected
    ShardHybrid().check(heads, None, ranks)  # the default always runs


@pytest.mark.parametrize(
    "size,heads,ranks,message",
    [
        (3, 4, 4, r"head_group_size = 3 does not divide the 4 model-parallel ranks; choose one of \[1, 2, 4\]"),
        (4, 2, 4, r"head_group_size = 4 gives a head group more ranks than the 2 heads; choose one of \[1, 2\]"),
    ],
)
def test_a_head_group_that_cannot_work_is_an_error_naming_the_knob(size, heads, ranks, message) -> None:
    config = ProcessorConfig(num_layers=1, num_channels=4 * heads, num_heads=heads, strategy=ShardHybrid(size))
    with pytest.raises(ConfigError, match=message):
        config.check_world_size(ranks)


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_head_group_size_out_of_range(value) -> None:
    with pytest.raises(StrategyOptionError, match="head_group_size"):
        resolve_strategy("shard_hybrid", {"head_group_size": value})


def test_the_option_shows_in_the_logged_settings() -> None:
    assert repr(resolve_strategy("shard_hybrid", {"head_group_size": 2})) == "ShardHybrid(head_group_size=2, ring=None)"


def _groups_of_each_rank(group) -> dict:
    import torch.distributed as dist

    model = TransformerProcessor(ProcessorConfig(num_layers=1, num_channels=8, num_heads=2, strategy="shard_hybrid"))
    groups = model.build_groups(group)
    return {
        "heads": dist.get_process_group_ranks(groups.axis_group("heads")),
        "sequence": dist.get_process_group_ranks(groups.axis_group("points")),
        "size": groups.dims.heads,
    }


def test_head_groups_are_consecutive_ranks_and_sequence_groups_stride_them(rank_pool) -> None:
    parts = rank_pool.run_ok(_groups_of_each_rank, 4)
    for rank, part in enumerate(parts):
        assert part["size"] == 2
        assert part["heads"] == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert part["sequence"] == [rank % 2, rank % 2 + 2]


def _forward_with_the_plain_group(group) -> None:
    model = TransformerProcessor(ProcessorConfig(num_layers=1, num_channels=8, num_heads=2, strategy="shard_hybrid"))
    model(torch.zeros(1, 5, 8), group=group)


def test_forward_without_the_groups_says_how_to_build_them(rank_pool) -> None:
    errors = rank_pool.run(_forward_with_the_plain_group, 4)  # 2 x 2: a heads and a points axis
    assert len(errors) == 4 and all("model.build_groups(group)" in e.message for e in errors)


def _forward_with_one_axis(group) -> tuple:
    model = TransformerProcessor(ProcessorConfig(num_layers=1, num_channels=8, num_heads=2, strategy="shard_hybrid"))
    return tuple(model(torch.ones(1, 5, 8), group=group).shape)


def test_a_head_group_of_every_rank_needs_no_groups_of_its_own(rank_pool) -> None:
    assert rank_pool.run_ok(_forward_with_one_axis, 2) == [(1, 5, 8)] * 2  # G = P: the heads axis only
