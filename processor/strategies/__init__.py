"""Model-parallel strategies: the contract (:class:`Strategy`) and the built-in ones by name.

A strategy is chosen by name (``none``, ``shard_heads``, ``shard_sequence``,
``shard_channels``) or given as an instance of your own :class:`Strategy` subclass (usually a
:class:`PointSharded` one); see :mod:`processor.strategies.base` for what a strategy is handed
and must return.
"""

from __future__ import annotations

from types import MappingProxyType

from processor.strategies.base import BlockParts, HeadAttention, PointSharded, ShardContext, SingleRank, Strategy
from processor.strategies.shard_channels import ShardChannels
from processor.strategies.shard_heads import ShardHeads
from processor.strategies.shard_sequence import ShardSequence

BUILT_IN = MappingProxyType({s.name: s for s in (SingleRank, ShardHeads, ShardSequence, ShardChannels)})


def resolve_strategy(strategy: str | Strategy) -> Strategy:
    """``strategy`` itself if it is a :class:`Strategy`, else the built-in one of that name;
    ``ValueError`` listing the built-in names otherwise."""
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str) or strategy not in BUILT_IN:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(BUILT_IN)} or pass a Strategy instance")
    return BUILT_IN[strategy]()


__all__ = [
    "BUILT_IN",
    "BlockParts",
    "HeadAttention",
    "PointSharded",
    "ShardChannels",
    "ShardContext",
    "ShardHeads",
    "ShardSequence",
    "SingleRank",
    "Strategy",
    "resolve_strategy",
]
