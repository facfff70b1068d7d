"""The strategy contract: a strategy states a transformer block's whole plan on its ranks.

A block is ``x + proj(attention(norm(x)))`` then ``x + mlp(norm(x))``. A strategy decides where
each part runs and which collectives sit between them (:meth:`Strategy.block`):

- :class:`PointSharded` strategies (``none``, ``shard_heads``, ``shard_sequence``,
  ``shard_hybrid``) keep every
  parameter on every rank and run norms, projections, residuals and the MLP on this rank's
  points; only attention mixes points, so they implement just :meth:`PointSharded.attend`:
  given the normed input ``h`` of the local points ``(batch, local_points, channels)``, the
  layer as a :class:`HeadAttention` and the :class:`ShardContext`, return the attention
  output of the local points before the output projection, same shape.
- ``shard_channels`` (:mod:`processor.strategies.shard_channels`) splits heads and MLP hidden
  channels, and their parameters, over the ranks: it overrides :meth:`Strategy.block` and
  :meth:`Strategy.split_parameters`.

A group of one rank never reaches a strategy: :class:`SingleRank` runs it, chosen in one place
(:meth:`ShardContext.build`).

Segment ids: when the caller passes per-point ids, :meth:`ShardContext.build` asks the strategy
once per forward for the ids its attention calls need (:meth:`Strategy.share_segment_ids`:
every point's by default, the halo-padded ones for ``shard_sequence``) and keeps them in
:attr:`ShardContext.key_segment_ids`; the layers reuse them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from processor.attention.score_mods import ScoreMods
from processor.distributed.mesh import ModelDims, ModelMesh
from processor.distributed.ranges import profiler_range
from processor.distributed.region import gather_points
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Transport
from processor.errors import UserError
from processor.strategies.cost import StrategyCost


class HeadAttention(Protocol):
    """What a strategy may call on a self-attention layer (implemented by
    :class:`processor.attention.SelfAttention`). ``h`` is ``(batch, points, channels)``."""

    num_heads: int  # the heads this module holds (all of them unless its parameters are split)
    head_dim: int
    window_size: int | None  # W: query i sees keys j with |i - j| <= W (None: every key)
    dropout_p: float  # attention dropout, applied in training mode
    training: bool
    qkv: nn.Linear  # the q, k, v projection, (3 * num_heads * head_dim, channels)
    proj: nn.Linear  # output projection, (channels, num_heads * head_dim)

    # first_point: the global index of h's first row (rotary embeddings rotate by it).

    def qkv_heads(self, h: Tensor, first_point: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v, each ``(batch, heads, points, head_dim)``, q and k normed."""
        ...

    def qkv_packed(self, h: Tensor, first_point: int = 0) -> Tensor:
        """``(batch, points, 3, heads, head_dim)``: q, k, v of each point side by side."""
        ...

    def queries(self, h: Tensor, first_point: int = 0) -> Tensor:
        """``(batch, heads, points, head_dim)``."""
        ...

    def keys_values(self, h: Tensor, first_point: int = 0) -> tuple[Tensor, Tensor]:
        """k, v, each ``(batch, heads, points, head_dim)``."""
        ...

    def score_mods(
        self, first_head: int | None = None, heads: int | None = None, device: torch.device | None = None
    ) -> ScoreMods | None:
        """Softcap and ALiBi slopes (on ``device``) of the layer's heads ``[first_head, first_head
        + heads)`` (default: the module's own), for attention calls made outside :meth:`attend`."""
        ...

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_offset: int = 0,
        segment_ids: Tensor | None = None,
        first_head: int | None = None,
    ) -> Tensor:
        """The layer's windowed attention: query ``i`` at key position ``q_offset + i``.
        ``(batch, heads, n_q, head_dim)`` over ``(batch, heads, n_k, head_dim)`` keys;
        ``segment_ids`` ``(batch or 1, n_k)``, aligned with the keys, restrict it to equal ids;
        ``first_head``: the layer's index of q's first head, when q holds a share of them."""
        ...

    def merge_heads(self, parts: list[Tensor]) -> Tensor:
        """Outputs of consecutive query ranges, each ``(batch, heads, n_i, head_dim)``, as one
        ``(batch, sum n_i, heads * head_dim)``."""
        ...


class BlockMLP(Protocol):
    """The per-point MLP of a block (:class:`processor.mlp.MLP`, :class:`processor.mlp.GatedMLP`)."""

    widening: tuple[nn.Linear, ...]  # the layers C -> hidden, each (hidden, C) with a bias
    narrow: nn.Linear  # (C, hidden); its bias is the output bias

    def __call__(self, x: Tensor, add_output_bias: bool = True) -> Tensor:
        """``(..., C)`` -> ``(..., C)``; ``add_output_bias=False`` leaves out ``narrow``'s bias."""
        ...


class BlockParts(Protocol):
    """The parts of a pre-norm transformer block (:class:`processor.TransformerBlock`)."""

    attn_norm: nn.LayerNorm
    attn: HeadAttention
    mlp_norm: nn.LayerNorm
    mlp: BlockMLP


@dataclass(frozen=True)
class ShardContext:
    """Everything about the model-parallel split that a layer needs, passed down every layer.

    ``window_size`` is the layers' window; ``key_segment_ids`` what the strategy made of this
    rank's segment ids for its attention calls (None: one segment); ``mesh`` the group's axes
    as the strategy's degrees lay them out (None on one rank)."""

    group: dist.ProcessGroup | None
    layout: ShardLayout
    strategy: Strategy
    transport: Transport
    window_size: int | None = None
    key_segment_ids: Tensor | None = None
    mesh: ModelMesh | None = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @classmethod
    def build(
        cls,
        group: dist.ProcessGroup | None,
        layout: ShardLayout,
        strategy: Strategy,
        transport: Transport,
        window_size: int | None = None,
        segment_ids: Tensor | None = None,
        mesh: ModelMesh | None = None,
    ) -> ShardContext:
        """The context for ``layout``: on one rank, :class:`SingleRank` instead of ``strategy``;
        with ``segment_ids``, the strategy's shared ids computed once here."""
        if layout.world_size == 1:
            group, strategy, mesh = None, SingleRank(), None
        ctx = cls(group, layout, strategy, transport, window_size, mesh=mesh)
        if segment_ids is None:
            return ctx
        return replace(ctx, key_segment_ids=ctx.strategy.share_segment_ids(segment_ids, ctx))


class StrategyOptionError(UserError):
    """An option a built-in strategy does not have, or a value out of its range: ``option`` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


class Strategy(StrategyCost, ABC):
    """A way to run transformer blocks over a model-parallel group: how a layer runs on the
    group's mesh (:meth:`degrees`), and what that costs (:class:`StrategyCost`'s methods).
    Subclass :class:`PointSharded` for a new way to mix points (a frozen dataclass for one with
    options, so that its ``repr`` names them) and pass an instance as
    :attr:`processor.ProcessorConfig.strategy`."""

    name: ClassVar[str]
    splits_parameters: ClassVar[bool] = False  # True: each rank holds a share (split_parameters)

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        """Raise ``ValueError`` if this strategy cannot run the configuration on ``world_size``
        ranks (one line naming the setting and how to fix it). Default: any size works."""
        return None

    def degrees(self, num_heads: int, world_size: int) -> ModelDims:
        """How this strategy lays ``world_size`` ranks out on the mesh's axes (called after
        :meth:`check`). Default: every rank a block of points."""
        return ModelDims(points=world_size)

    @abstractmethod
    def block(self, parts: BlockParts, x: Tensor, ctx: ShardContext) -> Tensor:
        """One block on this rank's points: ``(batch, local_points, channels)`` -> same shape."""

    def share_segment_ids(self, segment_ids: Tensor, ctx: ShardContext) -> Tensor:
        """This rank's ids ``(batch or 1, local_points)`` -> the ids aligned with the keys its
        attention calls use. Default: every point's, ``(batch or 1, points)``."""
        if ctx.world_size == 1:
            return segment_ids
        sizes = ctx.layout.sizes
        return gather_points(segment_ids, ctx.group, dim=1, sizes=sizes, transport=ctx.transport, check=False)

    def split_parameters(self, parts: BlockParts, rank: int, world_size: int) -> None:
        """Replace the block's parameters by this rank's share, in place. Default: every rank
        keeps all of them (replicated)."""
        return None

    def phase(self, name: str) -> AbstractContextManager:
        """A profiler range ``gridshard/<strategy>/<name>`` around one phase of a block, so that
        a trace reads as the strategy does (the collectives inside carry their own ranges)."""
        return profiler_range(f"{self.name}/{name}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def require_a_head_per_rank(name: str, num_heads: int, world_size: int) -> None:
    """``ValueError`` for a strategy that splits the heads over the ranks, when there are more
    ranks than heads."""
    if world_size > num_heads:
        raise ValueError(
            f"strategy {name!r} needs num_heads >= ranks (a head per rank): {num_heads} heads on "
            f"{world_size} ranks; use more heads, fewer ranks, or shard_sequence"
        )


class PointSharded(Strategy):
    """Parameters replicated, every part of the block on this rank's points; subclasses decide
    how attention meets the keys held by other ranks."""

    def block(self, parts: BlockParts, x: Tensor, ctx: ShardContext) -> Tensor:
        attn = parts.attn
        with self.phase("attention"):
            x = x + attn.proj(self.attend(attn, parts.attn_norm(x), ctx))
        with self.phase("mlp"):
            return x + parts.mlp(parts.mlp_norm(x))

    @abstractmethod
    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` normed input -> the attention output of the local
        points before the output projection, same shape. ``ctx.world_size > 1``."""


class SingleRank(PointSharded):
    """``none``: one rank holds every point."""

    name = "none"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        if world_size != 1:
            raise ValueError(
                f"strategy 'none' runs on one rank, the group has {world_size}: choose shard_sequence, "
                "shard_heads or shard_channels"
            )

    def degrees(self, num_heads: int, world_size: int) -> ModelDims:
        return ModelDims()

    def layer_bytes(self, work, sizes: list[int], rank: int) -> int:
        return 0

    def comm_parts(self, work, sizes: list[int], sent: int) -> list:
        return []

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        q, k, v = attn.qkv_heads(h)
        return attn.merge_heads([attn.attend(q, k, v, segment_ids=ctx.key_segment_ids)])
