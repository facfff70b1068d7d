"""Model-parallel strategies, chosen by name: ``none``, ``shard_heads``, ``shard_sequence``."""

from processor.strategies.base import ShardContext, Strategy
from processor.strategies.none import SingleRank
from processor.strategies.shard_heads import ShardHeads
from processor.strategies.shard_sequence import ShardSequence

STRATEGIES: dict[str, type] = {s.name: s for s in (SingleRank, ShardHeads, ShardSequence)}


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; ``ValueError`` listing the known ones otherwise."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    return STRATEGIES[name]()


__all__ = ["STRATEGIES", "ShardContext", "Strategy", "get_strategy"]
