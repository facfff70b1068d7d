"""The strategy contract: what a model-parallel strategy is given, what it may call, what it returns.

Projections and norms are per point and run wherever the point lives; only attention mixes
points, so a strategy decides how this rank's queries meet the keys held by other ranks. It
is handed

- ``h``: the normed input of this rank's points, ``(batch, local_points, channels)``;
- ``attn``: a :class:`HeadAttention`, the *only* interface to the layer: projections to
  heads, the windowed kernel with the layer's window, and the merge back to channels;
- ``ctx``: a :class:`ShardContext`, the group, the layout of points and the transport that
  every collective goes through;

and returns the attention output of its local points *before* the output projection,
``(batch, local_points, channels)``, exactly what one rank holding every point would compute
for them. A group of one rank never reaches a strategy: :class:`SingleRank` runs it, chosen in
one place (:meth:`ShardContext.build`).

Room to grow: per-point segment ids (attend only within a segment) become a field of
:class:`ShardContext` that strategies forward to :meth:`HeadAttention.attend`; a strategy that
also splits the projections and the MLP over the ranks (tensor parallelism) gets further
hooks beside :meth:`Strategy.attend` for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch.distributed as dist
from torch import Tensor

from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Transport


class HeadAttention(Protocol):
    """What a strategy may call on a self-attention layer (implemented by
    :class:`processor.attention.SelfAttention`). ``h`` is ``(batch, points, channels)``."""

    num_heads: int
    head_dim: int
    window_size: int | None  # W: query i sees keys j with |i - j| <= W (None: every key)

    def qkv_heads(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v, each ``(batch, heads, points, head_dim)``, q and k normed."""
        ...

    def qkv_packed(self, h: Tensor) -> Tensor:
        """``(batch, points, 3, heads, head_dim)``: q, k, v of each point side by side."""
        ...

    def queries(self, h: Tensor) -> Tensor:
        """``(batch, heads, points, head_dim)``."""
        ...

    def keys_values(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """k, v, each ``(batch, heads, points, head_dim)``."""
        ...

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_offset: int = 0) -> Tensor:
        """The layer's windowed attention: query ``i`` at key position ``q_offset + i``.
        ``(batch, heads, n_q, head_dim)`` over ``(batch, heads, n_k, head_dim)`` keys."""
        ...

    def merge_heads(self, parts: list[Tensor]) -> Tensor:
        """Outputs of consecutive query ranges, each ``(batch, heads, n_i, head_dim)``, as one
        ``(batch, sum n_i, channels)``."""
        ...


@dataclass(frozen=True)
class ShardContext:
    """Everything about the model-parallel split that a layer needs, passed down every layer."""

    group: dist.ProcessGroup | None
    layout: ShardLayout
    strategy: Strategy
    transport: Transport

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @classmethod
    def build(
        cls, group: dist.ProcessGroup | None, layout: ShardLayout, strategy: Strategy, transport: Transport
    ) -> ShardContext:
        """The context for ``layout``: on one rank, :class:`SingleRank` instead of ``strategy``."""
        if layout.world_size == 1:
            return cls(None, layout, SingleRank(), transport)
        return cls(group, layout, strategy, transport)


class Strategy(ABC):
    """A way to split attention over a model-parallel group. Subclass it (a frozen dataclass
    for one with options, so that its ``repr`` names them) and pass an instance as
    :attr:`processor.ProcessorConfig.strategy`."""

    name: ClassVar[str]

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        """Raise ``ValueError`` if this strategy cannot run the configuration on ``world_size``
        ranks (one line naming the setting and how to fix it). Default: any size works."""
        return None

    @abstractmethod
    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` normed input -> the attention output of the local
        points before the output projection, same shape. ``ctx.world_size > 1``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SingleRank(Strategy):
    """``none``: one rank holds every point."""

    name = "none"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        if world_size != 1:
            raise ValueError(
                f"strategy 'none' runs on one rank, the group has {world_size}: choose shard_sequence or shard_heads"
            )

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        q, k, v = attn.qkv_heads(h)
        return attn.merge_heads([attn.attend(q, k, v)])
