"""Model-parallel strategies: the contract (:class:`Strategy`) and the built-in ones by name.

A strategy is chosen by name (``none``, ``shard_heads``, ``shard_sequence``,
``shard_channels``, ``shard_hybrid``) or given as an instance of your own :class:`Strategy` subclass (usually a
:class:`PointSharded` one); see :mod:`processor.strategies.base` for what a strategy is handed
and must return.
"""

from __future__ import annotations

import dataclasses
import importlib
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
from processor.strategies.cost import CommPart, StrategyCost, Workload
from processor.strategies.shard_channels import ShardChannels
from processor.strategies.shard_heads import ShardHeads
from processor.strategies.shard_hybrid import ShardHybrid
from processor.strategies.shard_sequence import ShardSequence

# In the order the planner tries them (a tie goes to the first).
BUILT_IN = MappingProxyType({s.name: s for s in (SingleRank, ShardSequence, ShardHeads, ShardChannels, ShardHybrid)})


def strategy_options(name: str) -> tuple[str, ...]:
    """The options of the strategy ``name`` (its dataclass fields; none for most)."""
    cls = strategy_class(name)
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()


def strategy_class(name: str) -> type[Strategy]:
    """A built-in strategy's class by name, or your own by import path ``package.module:ClassName``
    (a :class:`Strategy` subclass), so that configs and sweeps can name it."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    module_name, _, class_name = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"strategy {name!r} cannot be imported ({exc}); give 'package.module:ClassName'") from None
    if not (isinstance(found, type) and issubclass(found, Strategy)):
        raise ValueError(f"strategy {name!r} is not a Strategy subclass")
    return found


def resolve_strategy(strategy: str | Strategy, options: Mapping[str, Any] | None = None) -> Strategy:
    """``strategy`` itself if it is a :class:`Strategy`, else the one of that name (built-in, or
    your own by import path, :func:`strategy_class`) with ``options`` (e.g. ``{"ring": False}``
    for ``shard_sequence``, ``{"head_group_size": 2}`` for ``shard_hybrid``). ``ValueError``
    listing the built-in names for an unknown name; :class:`StrategyOptionError` for an
    unknown option."""
    options = dict(options or {})
    if isinstance(strategy, Strategy):
        if options:
            raise StrategyOptionError(
                next(iter(options)), "options go to built-in strategies by name, not to an instance"
            )
        return strategy
    if not isinstance(strategy, str) or (strategy not in BUILT_IN and ":" not in strategy):
        raise ValueError(
            f"unknown strategy {strategy!r}; choose one of {sorted(BUILT_IN)}, give your own as "
            "'package.module:ClassName', or pass a Strategy instance"
        )
    known = strategy_options(strategy)
    for option in options:
        if option not in known:
            raise StrategyOptionError(
                option, f"strategy {strategy!r} has no such option; its options: {list(known) or 'none'}"
            )
    return strategy_class(strategy)(**options)


__all__ = [
    "BUILT_IN",
    "BlockParts",
    "CommPart",
    "HeadAttention",
    "PointSharded",
    "ShardChannels",
    "ShardContext",
    "ShardHeads",
    "ShardHybrid",
    "ShardSequence",
    "SingleRank",
    "Strategy",
    "StrategyCost",
    "StrategyOptionError",
    "Workload",
    "resolve_strategy",
    "strategy_class",
    "strategy_options",
]
