"""Model-parallel strategies: the contract (:class:`Strategy`) and the built-in ones by name.

A strategy is chosen by name (``none``, ``shard_heads``, ``shard_sequence``,
``shard_channels``, ``shard_hybrid``) or given as an instance of your own :class:`Strategy` subclass (usually a
:class:`PointSharded` one); see :mod:`processor.strategies.base` for what a strategy is handed
and must return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from processor.strategies.base import (
    BlockParts,
    HeadAttention,
    PointSharded,
    ShardContext,
    SingleRank,
    Strategy,
    StrategyOptionError,
)
from processor.strategies.shard_channels import ShardChannels
from processor.strategies.shard_heads import ShardHeads
from processor.strategies.shard_hybrid import ShardHybrid
from processor.strategies.shard_sequence import ShardSequence

BUILT_IN = MappingProxyType({s.name: s for s in (SingleRank, ShardHeads, ShardSequence, ShardChannels, ShardHybrid)})


def strategy_options(name: str) -> tuple[str, ...]:
    """The options of the built-in strategy ``name`` (its dataclass fields; none for most)."""
    cls = BUILT_IN[name]
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()


def resolve_strategy(strategy: str | Strategy, options: Mapping[str, Any] | None = None) -> Strategy:
    """``strategy`` itself if it is a :class:`Strategy`, else the built-in one of that name with
    ``options`` (e.g. ``{"ring": False}`` for ``shard_sequence``, ``{"head_group_size": 2}``
    for ``shard_hybrid``). ``ValueError`` listing the
    built-in names for an unknown name; :class:`StrategyOptionError` for an unknown option."""
    options = dict(options or {})
    if isinstance(strategy, Strategy):
        if options:
            raise StrategyOptionError(
                next(iter(options)), "options go to built-in strategies by name, not to an instance"
            )
        return strategy
    if not isinstance(strategy, str) or strategy not in BUILT_IN:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {sorted(BUILT_IN)} or pass a Strategy instance")
    known = strategy_options(strategy)
    for option in options:
        if option not in known:
            raise StrategyOptionError(
                option, f"strategy {strategy!r} has no such option; its options: {list(known) or 'none'}"
            )
    return BUILT_IN[strategy](**options)


__all__ = [
    "BUILT_IN",
    "BlockParts",
    "HeadAttention",
    "PointSharded",
    "ShardChannels",
    "ShardContext",
    "ShardHeads",
    "ShardHybrid",
    "ShardSequence",
    "SingleRank",
    "Strategy",
    "StrategyOptionError",
    "resolve_strategy",
    "strategy_options",
]
